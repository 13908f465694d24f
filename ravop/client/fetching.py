"""R.fetch_persisting_op and R.fetch_losses: a graph's persisted values, read back from Redis (by the graph's
kind: a tensor or saved model of a planned graph, a statistic of a federated one)."""
import time
from typing import Any, Optional, Union

import redis

from ..core import graph_states
from ..core.errors import GraphStateError, UnknownPersistName
from ..core.loss_names import TRAINING_PREFIX, VALIDATION_PREFIX
from ..record.graph import Graph, Op
from ..store import GraphKeys
from ..store.lookup import find_graph
from .fetched_tensor import fetched
from .graph_kinds import kind_of
from ..store import seals
from .session import Session, require
from .stored_values import done_value, done_values, fetch_tensor
from .training_losses import Losses, losses_of, read


def fetch_persisting_op(op_name: Union[str, Op], wait: bool = False, timeout: Optional[float] = None,
                        graph: Union[None, Graph, str] = None) -> Any:
    """The value persisted under `op_name` (or the persisted `Op` itself), as a torch.Tensor that also answers
    the original's `['result']` (`ravop.client.fetched_tensor`; for a saved model, the object its loader builds), of the
    current graph, or of `graph` (a `Graph`, a graph id or name: an earlier graph's values stay fetchable; an Op
    names its own graph). A value not computed yet raises `NotComputedError`, or with `wait=True` is waited for
    (up to `timeout` seconds); an unknown name raises `UnknownPersistName`; a failed graph `GraphFailedError`."""
    session = require()
    if isinstance(op_name, Op):
        op = op_name
        graph = op.graph if graph is None else graph
        op_name = persisted_name(op)
    elif not isinstance(op_name, str):
        raise TypeError(f"fetch_persisting_op takes a persist name or a persisted Op, not {type(op_name).__name__}")
    try:
        keys = graph_keys(session, graph)
        deadline = None if timeout is None else time.monotonic() + timeout
        node_id = session.activated_names.get(op_name) if keys.graph_id == session.graph_id else None
        if node_id is not None:   # a value of the graph this session activated: no lookup in Redis
            value = done_value(session, keys, op_name)
            if value is None:
                value = fetch_tensor(session, keys, op_name, node_id, wait, deadline)   # checks its seal
            elif session.sealed(keys):
                seals.check(session.client, keys, op_name, node_id, value)
            return fetched(value)
        kind = kind_of(session.client.hget(keys.meta, "approach"))
        return kind.fetch(session, keys, op_name, wait, deadline)
    except redis.ConnectionError:
        if session.embedded is not None:
            session.embedded.check()   # its server killed: say so, not "Connection refused"
        raise


def persisted_name(op: Op) -> str:
    """The name `op` was persisted under (the first one, if several: they hold the same value)."""
    names = [name for name, persisted in op.graph.persisted.items() if persisted is op]
    if not names:
        raise UnknownPersistName(f"{op!r} (recorded at {op.source}) was not persisted: call "
                                 f"op.persist_op('name') before R.activate() to fetch its value")
    return names[0]


def graph_keys(session: Session, graph: Union[None, Graph, str]) -> GraphKeys:
    """GraphKeys of `graph` for this session: None (the current graph), a `Graph`, or a graph id or name."""
    if graph is None:
        return session.keys()
    if isinstance(graph, Graph):
        if not graph.activated:
            raise GraphStateError(f"graph {graph.name!r} has not been activated, so it has no values in Redis: "
                                  "call R.activate() and R.execute()")
        return GraphKeys(session.token, graph.id)
    if isinstance(graph, str):
        return find_graph(session.client, session.token, graph)
    raise TypeError(f"graph must be None, a ravop Graph, or a graph id or name, not {type(graph).__name__}")


def done_losses(keys: GraphKeys) -> Losses:
    """`ravop.client.training_losses.read` of the finished graph at `keys`, from the small values this session's fetches
    by name read (`ravop.client.stored_values.DoneValues`) where it activated that graph and they hold every loss: a
    fit's History and the user's fetches of its losses after it then share one round trip."""
    session = require()
    if keys.graph_id == session.graph_id:
        # the names given one by one must all be there; a rule's are there as far as its loop ran (rule_values)
        listed = [n for n in session.activated_names.listed if n.startswith((TRAINING_PREFIX, VALIDATION_PREFIX))]
        done = done_values(session, keys)
        if done is not None and all(name in done.stored for name in listed):
            short = any(rule.names[-1] not in done.stored for rule in session.activated_names.rules
                        if rule.names.template.startswith((TRAINING_PREFIX, VALIDATION_PREFIX)))
            return losses_of(session.client, keys, graph_states.DONE,
                             {name: data for name, data in done.stored.items()
                              if name.startswith((TRAINING_PREFIX, VALIDATION_PREFIX))}, short=short)
    return read(session.client, keys)


def fetch_losses(graph: Union[None, Graph, str] = None) -> Losses:
    """The persisted losses of `graph` (default: the current one; or a `Graph`, a graph id or a name) as a
    `Losses` (arrays), in one round trip, whether the graph is still training or done."""
    session = require()
    return read(session.client, graph_keys(session, graph))
