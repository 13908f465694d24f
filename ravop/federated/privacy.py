"""Differential privacy of what a provider releases (`"privacy": {"epsilon": e, "delta": d}` in the rules),
with OpenDP's measurements: Laplace noise when delta is 0, Gaussian noise calibrated to (epsilon, delta)
otherwise. OpenDP samples its noise exactly from a cryptographically secure source, which a float sampler
written here would not (Mironov, CCS 2012).

One person is one row; a query may add or remove a row (unbounded neighbours). A rule keeps values in
[min, max], so one row changes a column's count by 1, its sum by at most max(|min|, |max|), its sum of squares by
max(min^2, max^2), and a histogram's counts by 1 in one bin. A query releases, per rule column, a count, a sum
and a sum of squares as its statistics need, and each histogram asked: its epsilon (and delta) is split evenly
over these (basic composition), so the query as a whole is (epsilon, delta)-DP for each provider's data.
Everything the provider derives from the noisy values afterwards (mean, M2, withholding under k) is
post-processing and costs nothing more.
"""
import math
from typing import Any, List, Sequence, Tuple

Releases = Sequence[Tuple[Sequence[float], float]]   # (values, sensitivity) of each release of one query


def _measurement(sensitivity: float, epsilon: float, delta: float) -> Any:
    import opendp.prelude as dp   # only a provider that answers private queries needs it
    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    if delta == 0:
        return dp.m.make_laplace(domain, dp.l1_distance(T=float), scale=sensitivity / epsilon)

    def gaussian(scale: float) -> Any:
        noise = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)
        return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(noise), delta)

    return gaussian(dp.binary_search_param(gaussian, d_in=sensitivity, d_out=(epsilon, delta)))


def release(releases: Releases, epsilon: float, delta: float) -> List[List[float]]:
    """Each release's values with noise, the query's (epsilon, delta) split evenly over the releases. A
    histogram (one person in one bin) is one release of sensitivity 1 in both L1 and L2."""
    share_epsilon, share_delta = epsilon / len(releases), delta / len(releases)
    noisy = []
    for values, sensitivity in releases:
        if sensitivity == 0:   # a rule [0, 0] keeps values that add nothing
            noisy.append([float(v) for v in values])
            continue
        noisy.append(list(_measurement(sensitivity, share_epsilon, share_delta)([float(v) for v in values])))
    return noisy


def sensitivities(low: float, high: float) -> Tuple[float, float]:
    """(of a sum, of a sum of squares) of values kept in [low, high]."""
    largest = max(abs(low), abs(high))
    return largest, largest * largest


def available() -> bool:
    try:
        import opendp  # noqa: F401
    except ImportError:
        return False
    return True


def noisy_partial(count: float, total: float, squares: float, low: float, high: float) -> dict:
    """The partial (count, mean, M2) a provider derives from its noisy count, sum and sum of squares: the mean
    clamped to the rule's range, M2 at least 0; min and max are not released (NaN)."""
    n = max(int(round(count)), 0)
    if not n:
        return {"count": 0}
    if math.isnan(total):   # only the count was asked
        return {"count": n, "mean": math.nan, "m2": math.nan, "min": math.nan, "max": math.nan}
    mean = min(max(total / n, low), high)
    return {"count": n, "mean": mean, "m2": max(squares - n * mean * mean, 0.0), "min": math.nan, "max": math.nan}
