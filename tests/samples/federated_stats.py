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


SAMPLES = {
    "federated_partial": [
        Sample((COLUMN,), reference=_numpy_partial, note="missing values dropped"),
        Sample((COLUMN,), {"low": 10, "high": 50}, reference=_numpy_partial, note="a rule's range"),
        Sample((COLUMN,), {"low": 100}, reference=_numpy_partial, note="nothing in range: count 0, the rest NaN"),
    ],
    **{f"federated_{name}": [Sample((PARTIALS,), reference=_released(name))]
       for name in ("mean", "variance", "standard_deviation", "min", "max", "count")},
}
