"""What the session's steps share to read a graph back from Redis: its state (`read_meta`), the error of a failed
graph, a stored tensor (waiting for it if asked), and why a value cannot be fetched yet."""
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Union

import torch

from . import graph_states, progress
from .errors import GraphFailedError, GraphStateError, NotComputedError, UnknownPersistName
from .store import GraphKeys
from .store import graphs as store_graphs
from .store import tensors as stored

if TYPE_CHECKING:
    from .session import Session

# How a persisted bundle (a trained model) is rebuilt at fetch: kind -> fn(spec, {key: tensor}) -> object.
# Packages that save bundles (ravdl) register their kinds here.
LOADERS: Dict[str, Callable[[Any, Dict[str, torch.Tensor]], Any]] = {}

WAIT_SECONDS = 0.05   # how often fetch_persisting_op(wait=True) looks for the value


def read_meta(session: "Session", keys: GraphKeys) -> Dict[str, str]:
    """The graph's state fields (`ravop.store.graphs.STATE_FIELDS`); GraphStateError if it is gone."""
    meta = store_graphs.read_state(session.client, keys)
    if not meta:
        raise GraphStateError(f"graph {keys.graph_id} of token {session.token!r} is no longer in Redis (flushed?)")
    return meta


def failure(meta: Dict[str, str]) -> GraphFailedError:
    """The GraphFailedError of a failed graph, carrying its op, error, worker, source line and subgraph."""
    error = GraphFailedError(store_graphs.describe_failure(meta))
    error.op, error.error, error.worker = meta.get("error_op"), meta.get("error"), meta.get("error_worker")
    error.source, error.subgraph = meta.get("error_source"), meta.get("error_subgraph")
    return error


def fetch_tensor(session: "Session", keys: GraphKeys, name: str, node_id: Union[None, int, bytes], wait: bool,
                 deadline: Optional[float]) -> torch.Tensor:
    """The tensor of node `node_id`, persisted as `name`, once computed."""
    if node_id is None:
        raise UnknownPersistName(f"persist name {name!r} is missing from graph {keys.graph_id}")
    key = keys.tensor(int(node_id))
    while True:
        pipe = session.client.pipeline(transaction=False)
        pipe.get(key)
        pipe.hmget(keys.meta, store_graphs.STATE_FIELDS)
        with progress.busy(f"fetching {name!r}"):
            data, meta = pipe.execute()
            meta = store_graphs.decode_state(meta)
            # Constants (and values folded into constants) are in Redis from R.activate() on, others only once
            # computed: nothing is returned before the graph starts, so the answer does not depend on folding.
            started = meta.get("state") != graph_states.ACTIVATED
            tensor = None if data is None or not started else stored.decode(session.client, key, data)
        if tensor is not None:
            return tensor
        if meta.get("state") == graph_states.DONE:
            raise GraphStateError(f"graph {meta['name']!r} is done but {name!r} is not in Redis")
        if not wait and not started:
            raise NotComputedError(f"{name!r} is not computed yet: graph {meta['name']!r} is activated but not "
                                   "started; call R.execute(), then R.track_progress() or "
                                   "fetch_persisting_op(name, wait=True)")
        not_ready(session, keys, name, meta, wait, deadline)


def not_ready(session: "Session", keys: GraphKeys, name: str, meta: Dict[str, str], wait: bool,
              deadline: Optional[float]) -> None:
    """Raise why `name` cannot be fetched yet, or (wait=True) pause before looking again."""
    if not meta:
        raise GraphStateError(f"graph {keys.graph_id} is no longer in Redis (flushed?)")
    if meta["state"] == graph_states.FAILED:
        raise failure(meta)
    if not wait:
        raise NotComputedError(f"{name!r} is not computed yet: graph {meta['name']!r} is {meta['state']} "
                               f"({meta['ops_done']} of {meta['n_ops']} ops run). R.track_progress() waits for "
                               "the whole graph; fetch_persisting_op(name, wait=True) waits for this value")
    if deadline is not None and time.monotonic() >= deadline:
        raise TimeoutError(f"{name!r} is still not computed: graph {meta['name']!r} is {meta['state']} "
                           f"({meta['ops_done']} of {meta['n_ops']} ops run)")
    if session.embedded is not None:
        session.embedded.check()
    time.sleep(WAIT_SECONDS)
