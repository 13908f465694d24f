"""Samples for the federated statistics ops (ravop/ops/federated_stats.py), with numpy references: a provider's
partial of one column, and each statistic released from merged partials (one row per rule column)."""
import numpy as np
import torch

from . import Sample

COLUMN = np.array([3.0, np.nan, 18.0, 41.5, 7.25, 80.0, 18.0], dtype=np.float64)


def _partial(values, low=None, high=None):
    kept = values[~np.isnan(values)]
    kept = kept[(kept >= (-np.inf if low is None else low)) & (kept <= (np.inf if high is None else high))]
    if not kept.size:
        return torch.tensor([0.0, np.nan, np.nan, np.nan, np.nan], dtype=torch.float64)
    mean = kept.mean()
    return torch.tensor([kept.size, mean, np.square(kept - mean).sum(), kept.min(), kept.max()], dtype=torch.float64)


def _numpy_partial(values, low=None, high=None):
    return _partial(np.asarray(values, dtype=np.float64), low, high)


# Two columns' merged partials: count, mean, M2, min, max.
PARTIALS = torch.tensor([[4.0, 2.5, 5.0, 1.0, 4.0], [3.0, -1.0, 8.0, -3.0, 1.0]], dtype=torch.float64)


def _released(name):
    def reference(partials):
        count, mean, m2, low, high = np.asarray(partials, dtype=np.float64).T
        values = {"count": count, "mean": mean, "min": low, "max": high, "variance": m2 / count,
                  "standard_deviation": np.sqrt(m2 / count)}[name]
        return torch.tensor(values, dtype=torch.float64)
    return reference


# A merged sketch's retained items (ascending) and their weights; per-provider bin counts (NaN: suppressed).
ITEMS = np.array([1.0, 2.0, 3.5, 4.0, 9.0])
WEIGHTS = np.array([1.0, 1.0, 2.0, 4.0, 8.0])
COUNTS = np.array([[5.0, np.nan, 0.0, 1.0, 6.0], [4.0, 7.0, 0.0, 1.0, 0.0]])


def _inclusive_quantile(items, weights, q=(0.5,)):
    cumulative = np.cumsum(np.asarray(weights, dtype=np.float64))
    items = np.asarray(items, dtype=np.float64)
    return torch.tensor([items[np.argmax(cumulative >= p * cumulative[-1])] for p in q], dtype=torch.float64)


def _merged_bins(counts, k=1):
    total = np.asarray(counts, dtype=np.float64).sum(0)
    return torch.tensor(np.where((total > 0) & (total < k), np.nan, total), dtype=torch.float64)


SAMPLES = {
    "federated_quantile": [
        Sample((ITEMS, WEIGHTS), {"q": (0.0, 0.0625, 0.07, 0.5, 1.0)}, reference=_inclusive_quantile,
               note="the inclusive rank: q 0.0625 is reached by the first item's weight"),
    ],
    "federated_median": [Sample((ITEMS, WEIGHTS), reference=_inclusive_quantile)],
    "federated_histogram": [
        Sample((COUNTS,), {"k": 3}, reference=_merged_bins, note="a provider's suppressed bin and a small sum"),
        Sample((COUNTS[1:],), reference=_merged_bins, note="one provider, k 1"),
    ],
    "federated_partial": [
        Sample((COLUMN,), reference=_numpy_partial, note="missing values dropped"),
        Sample((COLUMN,), {"low": 10, "high": 50}, reference=_numpy_partial, note="a rule's range"),
        Sample((COLUMN,), {"low": 100}, reference=_numpy_partial, note="nothing in range: count 0, the rest NaN"),
    ],
    **{f"federated_{name}": [Sample((PARTIALS,), reference=_released(name))]
       for name in ("mean", "variance", "standard_deviation", "min", "max", "count")},
}
