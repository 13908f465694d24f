"""Statistics of a column from per-provider partials, merged exactly.

A provider reduces the values it keeps to a partial (count, mean, M2 = sum of squared deviations from the
mean, min, max); partials merge pairwise with Chan, Golub and LeVeque's parallel formulas:

    n = na + nb,  d = mean_b - mean_a,  mean = mean_a + d nb / n,  M2 = M2a + M2b + d^2 na nb / n

so the merged mean and population variance (M2 / n) are those of the union, without the union ever being in
one place. Partials are merged in the providers' name order: the same providers give the same bits.
"""
import math

import numpy as np

STATISTICS = ("mean", "variance", "standard_deviation", "min", "max", "count")
FIELDS = ("count", "mean", "m2", "min", "max")


def partial(values, low=None, high=None):
    """The partial of the values in [low, high] (None: unbounded), missing values (NaN) dropped."""
    values = np.asarray(values, dtype=np.float64)
    keep = ~np.isnan(values)
    if low is not None:
        keep &= values >= low
    if high is not None:
        keep &= values <= high
    kept = values[keep]
    if not kept.size:
        return {"count": 0}
    mean = kept.mean()
    return {"count": int(kept.size), "mean": float(mean), "m2": float(np.square(kept - mean).sum()),
            "min": float(kept.min()), "max": float(kept.max())}


def merge(a, b):
    """The partial of the union of two partials' values."""
    if not a["count"]:
        return b
    if not b["count"]:
        return a
    n = a["count"] + b["count"]
    delta = b["mean"] - a["mean"]
    return {"count": n, "mean": a["mean"] + delta * b["count"] / n,
            "m2": a["m2"] + b["m2"] + delta * delta * a["count"] * b["count"] / n,
            "min": min(a["min"], b["min"]), "max": max(a["max"], b["max"])}


def statistic(merged, name):
    """One released statistic (a Python float) of a merged partial."""
    if name == "count":
        return float(merged["count"])
    if name in ("mean", "min", "max"):
        return merged[name]
    variance = merged["m2"] / merged["count"]
    return variance if name == "variance" else math.sqrt(variance)


def check_partial(value):
    """A partial read from Redis, as a dict of numbers; ValueError if it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("count"), int) or value["count"] < 0:
        raise ValueError(f"not a partial: {value!r}"[:200])
    if value["count"] and not all(isinstance(value.get(f), (int, float)) for f in FIELDS):
        raise ValueError(f"a partial lacks {', '.join(f for f in FIELDS if f not in value)}")
    return value
