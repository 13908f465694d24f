"""Releasing a quantile or a histogram of one column from the providers' partials (all of them in range and
not withheld), through the `federated_quantile` and `federated_histogram` ops' kernels."""
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..ops.federated_stats import federated_histogram, federated_quantile
from . import sketches
from .histograms import edges
from .queries import Query


def release_extra(query: Query, column: str, limits: Tuple[Optional[float], Optional[float]], k: int,
                  partials: Sequence[Dict[str, Any]]) -> Union[float, List[float], Dict[str, list]]:
    if query.statistic == "quantile":
        return quantiles(query, [part.get("sketch") for part in partials])
    return histogram(query, column, limits, k, [part.get("histograms", {}).get(query.histogram_key())
                                                for part in partials])


def quantiles(query: Query, encoded: Sequence[Any]) -> Union[float, List[float]]:
    items, weights = sketches.merged_items(encoded)
    if not items.size:
        raise ValueError("the providers' sketches hold no value")
    found = federated_quantile(torch.from_numpy(items), torch.from_numpy(weights), query.q).tolist()
    return found[0] if query.scalar else found


def histogram(query: Query, column: str, limits: Tuple[Optional[float], Optional[float]], k: int,
              provider_counts: Sequence[Any]) -> Dict[str, list]:
    """{"edges": [...], "counts": [int, or None where suppressed]}."""
    rows = []
    for counts in provider_counts:
        if (not isinstance(counts, list) or len(counts) != query.bins
                or not all(c is None or (isinstance(c, int) and c >= 0) for c in counts)):
            raise ValueError(f"a provider's histogram of column {column!r} is not {query.bins} counts")
        rows.append([math.nan if c is None else float(c) for c in counts])
    merged = federated_histogram(torch.tensor(rows, dtype=torch.float64), k=k).tolist()
    return {"edges": edges(query, column, limits).tolist(),
            "counts": [None if math.isnan(c) else int(c) for c in merged]}
