"""What a federated graph asks of its providers beyond the plain partial: the statistic persisted under each
name, with its parameters, as the JSON the session writes and the providers read (never code).

    "mean"                                                  a statistic of the plain partial
    {"statistic": "quantile", "q": [0.1, 0.5], "scalar": false}
    {"statistic": "histogram", "bins": 10, "range": [0, 100]}   range null: each rule's own [min, max]

A quantile needs each provider's KLL sketch of a column (`ravop.federated.sketches`); a histogram needs its
bin counts over the histogram's edges (`ravop.federated.histograms`).
"""
import json
from typing import Dict, Optional, Sequence, Tuple, Union

from ..ops.federated_stats import PARAMETERISED, check_histogram, check_q


class Query:
    __slots__ = ("statistic", "q", "scalar", "bins", "range")

    def __init__(self, statistic: str, q: Sequence[float] = (), scalar: bool = True, bins: int = 0,
                 range: Optional[Tuple[float, float]] = None) -> None:
        self.statistic, self.q, self.scalar, self.bins, self.range = statistic, tuple(q), scalar, bins, range

    def to_json(self) -> str:
        if self.statistic == "quantile":
            return json.dumps({"statistic": "quantile", "q": list(self.q), "scalar": self.scalar})
        if self.statistic == "histogram":
            return json.dumps({"statistic": "histogram", "bins": self.bins,
                               "range": list(self.range) if self.range else None})
        return self.statistic

    def histogram_key(self) -> str:
        """The name of this histogram's counts in a provider's partial (two queries with the same bins share)."""
        return json.dumps([self.bins, list(self.range) if self.range else None])


def parse_query(stored: Union[str, bytes]) -> Query:
    """A `Query` from a stats-hash value; ValueError naming what is wrong (a hostile graph fails, no more)."""
    if isinstance(stored, bytes):
        stored = stored.decode()
    if not stored.startswith("{"):
        return Query(stored)
    try:
        spec = json.loads(stored)
    except ValueError:
        raise ValueError(f"a federated query is not valid JSON: {stored[:100]!r}") from None
    if not isinstance(spec, dict) or spec.get("statistic") not in PARAMETERISED:
        raise ValueError(f"a federated query must name a statistic among {', '.join(PARAMETERISED)}: "
                         f"{stored[:100]!r}")
    if spec["statistic"] == "quantile":
        q, _ = check_q(spec.get("q"))
        return Query("quantile", q=q, scalar=bool(spec.get("scalar")))
    bins, range = check_histogram(spec.get("bins"), spec.get("range"))
    return Query("histogram", bins=bins, range=range)


def parse_queries(stats: Dict[bytes, bytes]) -> Dict[str, Query]:
    """{persist name: Query} of a graph's stats hash."""
    return {name.decode(): parse_query(value) for name, value in sorted(stats.items())}
