"""Statistics of a column from per-provider partials, merged exactly.

A provider reduces the values it keeps to a partial (count, mean, M2 = sum of squared deviations from the
mean, min, max: the `federated_partial` op); partials merge pairwise with Chan, Golub and LeVeque's parallel
formulas:

    n = na + nb,  d = mean_b - mean_a,  mean = mean_a + d nb / n,  M2 = M2a + M2b + d^2 na nb / n

so the merged mean and population variance (M2 / n) are those of the union, without the union ever being in
one place; the `federated_<statistic>` op releases one statistic of it. Partials travel through Redis as JSON
dicts and are merged in the providers' name order: the same providers give the same bits.
"""
import math
from typing import Any, Optional, Union

import torch

from ..core.registry import get
from ..ops.federated_stats import PARTIAL_FIELDS, PREFIX, federated_partial

Partial = dict   # {"count": int} or {"count", "mean", "m2", "min", "max"}


def partial(values: Any, low: Optional[float] = None, high: Optional[float] = None) -> Partial:
    """The partial of the values in [low, high] (None: unbounded), missing values (NaN) dropped, as the JSON
    dict a provider writes."""
    row = federated_partial(torch.as_tensor(values, dtype=torch.float64), low=low, high=high).tolist()
    if not row[0]:
        return {"count": 0}
    return {"count": int(row[0]), **dict(zip(PARTIAL_FIELDS[1:], row[1:]))}


def merge(a: Partial, b: Partial) -> Partial:
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


def statistic(merged: Partial, name: str) -> float:
    """One released statistic (a Python float) of a merged partial, by the `federated_<name>` op's kernel."""
    row = torch.tensor([[float(merged.get(field, math.nan)) for field in PARTIAL_FIELDS]], dtype=torch.float64)
    return float(get(PREFIX + name).kernel(row)[0])


def check_partial(value: Union[Partial, object]) -> Partial:
    """A partial read from Redis, as a dict of numbers; ValueError if it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("count"), int) or value["count"] < 0:
        raise ValueError(f"not a partial: {value!r}"[:200])
    if value["count"] and not all(isinstance(value.get(f), (int, float)) for f in PARTIAL_FIELDS):
        raise ValueError(f"a partial lacks {', '.join(f for f in PARTIAL_FIELDS if f not in value)}")
    return value
