"""What the session's steps share to read a graph back from Redis: its state (`read_meta`), the error of a failed
graph, a stored tensor (waiting for it if asked), and why a value cannot be fetched yet."""
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Union

import redis
import torch

from ..core import graph_states, progress
from ..core.errors import GraphCancelledError, GraphFailedError, GraphStateError, NotComputedError, UnknownPersistName
from ..store import GraphKeys
from ..store import graphs as store_graphs
from ..store import seals, server_replies
from ..store import tensors as stored
from ..store.small_values import read_small_values
from ..wire.codec import decode_alike, decode_tensor, is_chunked

if TYPE_CHECKING:
    from .session import Session

# How a persisted bundle (a trained model) is rebuilt at fetch: kind -> fn(spec, {key: tensor}) -> object.
# Packages that save bundles (ravdl) register their kinds here.
LOADERS: Dict[str, Callable[[Any, Dict[str, torch.Tensor]], Any]] = {}

WAIT_SECONDS = 0.05   # how often fetch_persisting_op(wait=True) looks for the value
SMALL_BYTES = 4096    # persisted values up to this size are read all at once when a graph is done


class DoneValues:
    """The small persisted values of one finished graph, read in one round trip the first time one of them is
    fetched: a finished graph's values no longer change, and a loop over its losses by name
    (`fetch_persisting_op('training_loss_epoch_1_batch_1')`, ...) then costs no request per loss. Decoded on
    first use; each fetch gets its own copy. A new graph (activated or flushed) replaces it."""

    def __init__(self, graph_id: str, stored: Dict[str, bytes]) -> None:
        self.graph_id = graph_id
        self.stored = {name: data for name, data in stored.items() if not is_chunked(data)}
        self.decoded: Dict[str, torch.Tensor] = {}
        self.alike_decoded = False

    def get(self, name: str) -> Optional[torch.Tensor]:
        tensor = self.decoded.get(name)
        if tensor is None:
            data = self.stored.get(name)
            if data is None:
                return None   # a large value, or none: read it on its own
            if not self.alike_decoded:   # the losses, all at once: a third of the cost of one by one
                self.alike_decoded = True
                names = list(self.stored)
                alike = decode_alike([self.stored[n] for n in names])
                self.decoded.update((n, t) for n, t in zip(names, alike) if t is not None)
                tensor = self.decoded.get(name)
            if tensor is None:
                tensor = self.decoded[name] = decode_tensor(data)
        return tensor.clone()


def done_values(session: "Session", keys: GraphKeys) -> Optional[DoneValues]:
    """`session.done_values` of the graph at `keys`, read now if it is another graph's or none; None if the graph
    is not done."""
    done = session.done_values
    if done is None or done.graph_id != keys.graph_id:
        state, stored_values = read_small_values(session.client, keys, SMALL_BYTES)
        if state != graph_states.DONE:
            return None
        done = session.done_values = DoneValues(keys.graph_id, stored_values)
    return done


def done_value(session: "Session", keys: GraphKeys, name: str) -> Optional[torch.Tensor]:
    """The value persisted as `name` if the graph at `keys` is done and it is small (from `session.done_values`,
    read for all of them on the first call); None otherwise (the caller fetches it on its own)."""
    done = done_values(session, keys)
    return None if done is None else done.get(name)


def read_meta(session: "Session", keys: GraphKeys) -> Dict[str, str]:
    """The graph's state fields (`ravop.store.graphs.STATE_FIELDS`); GraphStateError if it is gone."""
    try:
        meta = store_graphs.read_state(session.client, keys)
    except redis.ResponseError as exc:
        if server_replies.kind_of(exc) != "damaged":
            raise
        raise GraphStateError(f"graph {keys.graph_id} of token {session.token!r} cannot be read: the server "
                              f"answered {server_replies.first_line(exc)!r} (its keys were damaged)") from None
    if not meta:
        raise GraphStateError(f"graph {keys.graph_id} of token {session.token!r} is no longer in Redis (flushed, "
                              "or its keys deleted)")
    return meta


def failure(meta: Dict[str, str]) -> GraphFailedError:
    """The GraphFailedError of a failed graph, carrying its op, error, worker, source line and subgraph; a
    GraphCancelledError (naming who cancelled it) of a cancelled one."""
    kind = GraphCancelledError if meta.get("state") == graph_states.CANCELLED else GraphFailedError
    error = kind(store_graphs.describe_failure(meta))
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
        # A big value shows its download in bytes.
        tensor = None if data is None or not started else stored.decode(session.client, key, data, desc=f"fetching {name!r}")
        if tensor is not None:
            if session.sealed(keys):   # checked at each fetch: a worker user may rewrite a value at any time
                seals.check(session.client, keys, name, int(node_id), tensor)
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
    if meta["state"] in graph_states.UNFINISHED:
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
