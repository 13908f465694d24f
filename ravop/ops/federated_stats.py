"""Federated statistics as registry ops. `federated_partial` is what a provider computes from one column of its
own data: the count, mean, M2 (sum of squared deviations from the mean), min and max of the values a rule keeps.
`federated_<statistic>` releases that statistic of each rule column from the partials of all providers merged
(`ravop.federated.partials.merge`), one row per column.

`R.federated_mean()` and its siblings (ravop.record.frontends) record a statistic op on the current federated graph
with no input: its partials come from the providers, never from a value of the graph (`ravop.client.federated_graphs`).
`R.federated_quantile(q)` and `R.federated_histogram(bins, range)` take parameters, which travel to the
providers as a query (`ravop.federated.queries`); their kernels release from merged sketches and bin counts."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Tuple

import torch

from ..core.alignment import aligned
from ..core.registry import register

if TYPE_CHECKING:
    from ..record.graph import Op

PARTIAL_FIELDS = ("count", "mean", "m2", "min", "max")   # the columns of a partial, in order
STATISTICS = ("mean", "variance", "standard_deviation", "min", "max", "count")
PREFIX = "federated_"
PARAMETERISED = ("quantile", "histogram")
MAX_BINS = 4096   # what a provider computes and writes for one histogram of one column, at most
STATISTIC_OPS = frozenset(PREFIX + statistic for statistic in STATISTICS + PARAMETERISED)  # a federated graph's


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
            return aligned(count)
        if statistic in ("mean", "min", "max"):
            return aligned({"mean": mean, "min": low, "max": high}[statistic])
        variance = m2 / count
        return variance if statistic == "variance" else torch.sqrt(variance)

    kernel.__name__ = PREFIX + statistic
    kernel.__doc__ = (f"The {statistic.replace('_', ' ')} of each rule column over the data of the graph's "
                      "providers, filtered by the rules; fetched as {column: float}.")
    return kernel


for _statistic in STATISTICS:
    _kernel = _release(_statistic)
    register(PREFIX + _statistic, inputs=("partials",), shape=_statistic_shape, method=False)(_kernel)


def _quantile_shape(items: Op, weights: Op, q: Sequence[float] = (0.5,)) -> Tuple[Tuple[int], torch.dtype]:
    return (len(q),), torch.float64


@register("federated_quantile", inputs=("items", "weights"), params={"q": (0.5,)}, shape=_quantile_shape,
          method=False)
def federated_quantile(items: torch.Tensor, weights: torch.Tensor, q: Sequence[float] = (0.5,)) -> torch.Tensor:
    """The q-quantile(s) of each rule column over the providers' data, from merged KLL sketches. As a kernel: for
    each q the smallest of the sketch's items (ascending) whose cumulative weight reaches q of the total (the
    inclusive rank of DataSketches)."""
    cumulative = torch.cumsum(weights.to(torch.float64), 0)
    wanted = torch.as_tensor(q, dtype=torch.float64, device=cumulative.device) * cumulative[-1]
    index = torch.searchsorted(cumulative, wanted).clamp(max=items.numel() - 1)
    return items.to(torch.float64)[index]


@register("federated_median", inputs=("items", "weights"), shape=lambda items, weights: ((1,), torch.float64),
          method=False)
def federated_median(items: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The median of each rule column over the providers' data: the 0.5-quantile of their merged sketches
    (`R.federated_median()` records a `federated_quantile`)."""
    return federated_quantile(items, weights, (0.5,))


def _histogram_shape(counts: Op, k: int = 1) -> Tuple[Tuple[int], torch.dtype]:
    return (counts.shape[-1],), torch.float64


@register("federated_histogram", inputs=("counts",), params={"k": 1}, shape=_histogram_shape, method=False)
def federated_histogram(counts: torch.Tensor, k: int = 1) -> torch.Tensor:
    """A histogram of each rule column over the providers' data. As a kernel: the bin counts of all providers
    (one row each, NaN where a provider suppressed a bin) summed; a bin is NaN (suppressed) if a provider
    suppressed it or it holds fewer than k values, but more than none."""
    total = counts.to(torch.float64).sum(0)
    return torch.where((total > 0) & (total < k), torch.nan, total)


def check_q(q: Any) -> Tuple[Tuple[float, ...], bool]:
    """(the probabilities, whether q was one number); ValueError unless each is a number in [0, 1]."""
    scalar = not isinstance(q, (list, tuple))
    values = [q] if scalar else list(q)
    if not values:
        raise ValueError("q must be a probability in [0, 1] or a non-empty list of them, not []")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"q must be a probability in [0, 1] or a list of them, not {value!r}")
    return tuple(float(v) for v in values), scalar


def check_histogram(bins: Any, range: Any) -> Tuple[int, Optional[Tuple[float, float]]]:
    """(bins, (low, high) or None); ValueError naming what is wrong."""
    if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be an integer in [1, {MAX_BINS}], not {bins!r}")
    if range is None:
        return bins, None
    if (not isinstance(range, (list, tuple)) or len(range) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in range)
            or not range[0] < range[1]):
        raise ValueError(f"range must be (low, high) with finite low < high, or None for each rule's own "
                         f"[min, max], not {range!r}")
    return bins, (float(range[0]), float(range[1]))
