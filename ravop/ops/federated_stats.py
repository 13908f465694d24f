"""Federated statistics as registry ops. `federated_partial` is what a provider computes from one column of its
own data: the count, mean, M2 (sum of squared deviations from the mean), min and max of the values a rule keeps.
`federated_<statistic>` releases that statistic of each rule column from the partials of all providers merged
(`ravop.federated.partials.merge`), one row per column.

`R.federated_mean()` and its siblings record a statistic op on the current federated graph with no input: its
partials come from the providers, never from a value of the graph (`ravop.federated.graph_kind`)."""
from typing import Callable, Optional, Tuple

import torch

from ..api import FRONTENDS
from ..errors import GraphStateError
from ..graph import Op, current_graph
from ..registry import register
from ..source import user_source

PARTIAL_FIELDS = ("count", "mean", "m2", "min", "max")   # the columns of a partial, in order
STATISTICS = ("mean", "variance", "standard_deviation", "min", "max", "count")
PREFIX = "federated_"
STATISTIC_OPS = frozenset(PREFIX + statistic for statistic in STATISTICS)   # what a federated graph may hold


def _partial_shape(values: Op, low: Optional[float] = None, high: Optional[float] = None) -> Tuple[Tuple[int], torch.dtype]:
    return (len(PARTIAL_FIELDS),), torch.float64


@register("federated_partial", inputs=("values",), params={"low": None, "high": None}, shape=_partial_shape,
          method=False)
def federated_partial(values: torch.Tensor, low: Optional[float] = None, high: Optional[float] = None) -> torch.Tensor:
    """The partial (count, mean, M2, min, max) of the values in [low, high] (None: unbounded), missing values
    (NaN) dropped; with no value kept, count is 0 and the other fields are NaN."""
    values = values.to(torch.float64).flatten()
    keep = ~torch.isnan(values)
    if low is not None:
        keep &= values >= low
    if high is not None:
        keep &= values <= high
    count = keep.sum().to(torch.float64)
    kept = torch.where(keep, values, 0.0)
    mean = kept.sum() / count
    m2 = torch.where(keep, torch.square(values - mean), 0.0).sum()
    low_value = torch.where(keep, values, torch.inf).amin() if values.numel() else count * torch.nan
    high_value = torch.where(keep, values, -torch.inf).amax() if values.numel() else count * torch.nan
    partial = torch.stack([count, mean, m2, low_value, high_value])
    return torch.where((count > 0) | (torch.arange(len(PARTIAL_FIELDS), device=values.device) == 0), partial,
                       torch.nan)


def _statistic_shape(partials: Op) -> Tuple[Tuple[int], torch.dtype]:
    if len(partials.shape) != 2 or partials.shape[1] != len(PARTIAL_FIELDS):
        raise ValueError(f"partials must be (columns, {len(PARTIAL_FIELDS)}): count, mean, M2, min and max per "
                         f"column, not {partials.shape}")
    return (partials.shape[0],), torch.float64


def _release(statistic: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def kernel(partials: torch.Tensor) -> torch.Tensor:
        count, mean, m2, low, high = partials.to(torch.float64).unbind(-1)
        if statistic == "count":
            return count
        if statistic in ("mean", "min", "max"):
            return {"mean": mean, "min": low, "max": high}[statistic]
        variance = m2 / count
        return variance if statistic == "variance" else torch.sqrt(variance)

    kernel.__name__ = PREFIX + statistic
    kernel.__doc__ = (f"The {statistic.replace('_', ' ')} of each rule column over the data of the graph's "
                      "providers, filtered by the rules; fetched as {column: float}.")
    return kernel


def _recorder(name: str, doc: Optional[str]) -> Callable[[], Op]:
    """`R.federated_<statistic>()`: one statistic of every rule column of the current federated graph, an `Op`
    of shape (columns,) that can be persisted."""
    def record() -> Op:
        graph = current_graph()
        graph.check_open()
        if graph.approach != "federated":
            raise GraphStateError(f"R.{name}() needs a federated graph: R.Graph(..., approach='federated', "
                                  f"rules=...), not the {graph.approach} graph {graph.name!r} (at {user_source()})")
        return graph.add_node(name, (), {}, (len(graph.rules.columns),), torch.float64, user_source())

    record.__name__ = record.__qualname__ = name
    record.__doc__ = doc
    return record


for _statistic in STATISTICS:
    _kernel = _release(_statistic)
    register(PREFIX + _statistic, inputs=("partials",), shape=_statistic_shape, method=False)(_kernel)
    FRONTENDS[PREFIX + _statistic] = _recorder(PREFIX + _statistic, _kernel.__doc__)
