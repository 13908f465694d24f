"""Histograms of a column from per-provider bin counts. A histogram has `bins` equal bins over its `range`, or
over the rule's own [min, max] when it gives none (numpy's convention: each bin holds low <= v < high, the last
one also its high edge; values outside are not counted).

Minimum group size: a provider suppresses each bin in which it holds more than none but fewer than k values
(its k: the larger of `--min-group-size` and the rules'), writing null there; the merged bin is then released
as None (suppressed, never merged into a neighbour, so that edges stay those asked). A merged bin of fewer than
the rules' k values is suppressed the same way.
"""
from typing import List, Optional, Tuple

import numpy as np

from .queries import Query


def edges(query: Query, column: str, limits: Tuple[Optional[float], Optional[float]]) -> np.ndarray:
    """The bins+1 edges of `query`'s histogram of a rule column; ValueError if neither gives a range."""
    low, high = query.range if query.range else limits
    if low is None or high is None or not low < high:
        raise ValueError(f"R.federated_histogram() without range= needs the rule of column {column!r} to give "
                         f"both min and max (min < max), not {limits}")
    return np.linspace(low, high, query.bins + 1)


def counts(values: np.ndarray, bin_edges: np.ndarray, k: int) -> List[Optional[int]]:
    """A provider's counts of its (filtered) values per bin, None where 0 < count < k."""
    found, _ = np.histogram(values, bin_edges)
    return [int(c) if c == 0 or c >= k else None for c in found]
