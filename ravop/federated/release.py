"""Releasing a quantile or a histogram of one column from the providers' partials (all of them in range and
not withheld), through the `federated_quantile` and `federated_histogram` ops' kernels; and the merged partials of
a secure graph, from the sum of its providers' masked sums."""
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..ops.federated_stats import federated_histogram, federated_quantile
from . import recovery, secure, sketches
from .column_rules import Rules
from .histograms import edges
from .queries import Query

Released = Union[float, List[float], Dict[str, list]]   # one column's value of a statistic


def release_extra(query: Query, column: str, limits: Tuple[Optional[float], Optional[float]], k: int,
                  partials: Sequence[Dict[str, Any]]) -> Released:
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


def unmask(rules: Rules, queries: List[Query], partials: Dict[str, Any], publics: Dict[str, str],
           reveals: Dict[str, Any], context: str) -> Tuple[Dict[str, dict], Dict[str, str], int]:
    """({column: merged partial (count, mean, M2; min and max NaN) with "histograms"}, {column: why withheld},
    the largest k of any provider) from the masked sums of the surviving providers of a secure graph, less the
    masks their revealed shares rebuild (`recovery.remove_masks`; `publics`: the graph's public keys;
    `context`: its reference)."""
    histograms = [query for query in queries if query.statistic == "histogram"]
    per_column = 3 + sum(query.bins for query in histograms)
    layout = secure.kinds(len(rules.columns), [query.bins for query in histograms])
    vectors, withheld, k = [], {}, rules.min_group_size
    secure.check_keys(partials)
    for provider, contribution in partials.items():
        if not isinstance(contribution, dict) or not isinstance(contribution.get("withheld"), dict):
            raise ValueError(f"provider {provider}'s contribution to a secure graph is not a masked partial")
        vectors.append(secure.unpack(contribution.get("secure"), layout))
        provider_k = contribution.get("k")
        k = max(k, provider_k if isinstance(provider_k, int) else k)
        for column in contribution["withheld"]:
            if column in rules.columns:
                withheld[column] = (f"provider {provider} holds fewer than k={k} values of it in range "
                                    "(minimum group size)")
    total = recovery.remove_masks(secure.add(vectors, layout), layout, partials, publics, reveals, context)
    sums = secure.decode(total, layout)
    merged = {}
    for i, (column, (low, high)) in enumerate(rules.columns.items()):
        count, shifted, squares, *bins = sums[i * per_column:(i + 1) * per_column]
        half = (high - low) / 2 if low is not None and high is not None else None
        secure.check_sums(column, count, shifted, squares, half, rules.privacy is not None)
        count = max(int(round(count)), 0)   # under privacy, noise may take a tiny count below 0
        if column in withheld:
            continue
        if count < k or not count:
            withheld[column] = f"fewer than k={k} values in range (minimum group size)"
            continue
        mean = shifted / count
        centre = secure.centre(low, high)
        if low is not None and high is not None:   # noise (under privacy) can push it out of the rule's range
            mean = min(max(mean, low - centre), high - centre)
        counts: Dict[str, List[int]] = {}
        for query in histograms:
            counts[query.histogram_key()] = [max(int(round(b)), 0) for b in bins[:query.bins]]
            bins = bins[query.bins:]
        merged[column] = {"count": count, "mean": centre + mean, "m2": max(squares - count * mean * mean, 0.0),
                          "min": math.nan, "max": math.nan, "histograms": counts}
    return merged, withheld, k
