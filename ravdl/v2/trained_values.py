"""Where a model's values are once the graph that trained it has run, so that the same model object predicts,
evaluates and trains on in the next graph (or in a later process, pickled or saved with `model.save(path)`).

A layer's values are Ops of the graph it was built in. `fit` persists every value a step carries (parameters,
buffers, the optimizer's moments) under `trained_value_{op id}`, so once that graph has run each of them has one
of three places, a `Place`:
- a tensor: a constant of its graph (values never trained: the requester still holds them), or one already read;
- a `Stored` reference (graph id, persist name): read from the store when the model enters another graph, once;
- a `NotStored` note: a value no one persisted (a hand-written loop without `model.persist_weights()`), which
  is an error naming that call when a new graph needs it, never fresh random weights.
A pickle keeps places, not Ops, so an unpickled model reads its values in a later session as well.
"""
from typing import Any, Optional, Union

import torch

import ravop as R
from ravop.core.errors import GraphStateError, NotComputedError
from ravop.store.lookup import GraphNotFound
from ravop.record.graph import Op, current_graph

PREFIX = "trained_value_"


class Stored:
    """A value persisted as `name` in graph `graph_id` (named `graph_name`, for messages)."""
    __slots__ = ("graph_id", "graph_name", "name")

    def __init__(self, graph_id: str, graph_name: str, name: str) -> None:
        self.graph_id, self.graph_name, self.name = graph_id, graph_name, name


class NotStored:
    """A value of graph `graph_name` that was not persisted; `what` names it (a layer's parameter)."""
    __slots__ = ("graph_name", "what")

    def __init__(self, graph_name: str, what: str) -> None:
        self.graph_name, self.what = graph_name, what


Place = Union[torch.Tensor, Stored, NotStored]


def persist(values: list[Any]) -> None:
    """Persist each Op of `values` (what a fit's step carries, after the fit) that is not a constant, so that
    the next graph can start from it."""
    for op in values:
        if op.id not in op.graph.constants:
            op.persist_op(f"{PREFIX}{op.id}")


def place_of(op: Any, what: str) -> Place:
    """Where the value of `op` (`what`, for messages) is found once its graph has run."""
    graph = op.graph
    if op.id in graph.constants:
        return graph.constants[op.id]
    name: Optional[str] = f"{PREFIX}{op.id}"   # fit's name for it, else any (persist_weights'), found by a scan
    if graph.persisted.get(name) is not op:
        name = next((name for name, persisted in graph.persisted.items() if persisted is op), None)
    return NotStored(graph.name, what) if name is None else Stored(graph.id, graph.name, name)


def read(place: Place, purpose: str) -> torch.Tensor:
    """The tensor at `place`, needed for `purpose` ("using the model in graph 'predict'"); a value that cannot be
    had raises GraphStateError naming what to do."""
    if isinstance(place, torch.Tensor):
        return place
    if isinstance(place, NotStored):
        raise GraphStateError(
            f"{place.what} was trained in graph {place.graph_name!r}, which did not persist it, so it cannot be had "
            f"for {purpose}: call model.persist_weights() before R.activate() in the graph that trains it (fit "
            "does that itself)")
    try:
        value = R.fetch_persisting_op(place.name, graph=place.graph_id)
    except (GraphNotFound, NotComputedError) as e:
        raise _not_run(place.graph_name, purpose, f" ({e})") from None
    return value.as_subclass(torch.Tensor)


def here(value: Union[Op, Place], what: str) -> Any:
    """`value` as an Op of the current graph: an Op of it as it is, an Op of an earlier graph or a `Place` by its
    value (`read`) made a constant of the current graph."""
    graph = current_graph()
    purpose = f"using the model in graph {graph.name!r}"
    if isinstance(value, Op):
        if value.graph is graph:
            return value
        if not value.graph.activated and value.id not in value.graph.constants:
            raise _not_run(value.graph.name, purpose, "")
        value = place_of(value, what)
    return R.t(read(value, purpose))


def _not_run(graph_name: str, purpose: str, detail: str) -> GraphStateError:
    return GraphStateError(f"the model's trained values are in graph {graph_name!r}, which has not run to its end"
                           f"{detail}: R.activate(), R.execute() and R.track_progress() it before {purpose}")
