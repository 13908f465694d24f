"""The loss curve the dashboard draws, made on the server: a fit of 75,000 steps would otherwise send 75,000
losses (about 1 MB of JSON) every second to draw a chart some 500 pixels wide. The computed steps are cut into
equal buckets and each bucket keeps its lowest and its highest loss, so the drawn line still reaches every
spike and every dip; the first and the last computed step are always kept."""
from typing import Any, Dict, List, Optional

import numpy as np

from ...client.training_losses import Losses

MAX_POINTS = 1000   # two per pixel column of the chart at most, min and max of a bucket


def extremes_per_bucket(values: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices into `values` (ascending): all of them if there are at most `max_points`, else the first, the
    last, and the index of the lowest and of the highest value of each of max_points // 2 - 1 buckets."""
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = max(max_points // 2 - 1, 1)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    starts = edges[:-1]
    lowest = np.minimum.reduceat(values, starts)
    highest = np.maximum.reduceat(values, starts)
    # The first index of each bucket's extreme: the position in `values` equal to it within the bucket.
    bucket_of = np.repeat(np.arange(buckets), np.diff(edges))
    at_low = np.flatnonzero(values == lowest[bucket_of])
    at_high = np.flatnonzero(values == highest[bucket_of])
    first_low = at_low[np.unique(bucket_of[at_low], return_index=True)[1]]
    first_high = at_high[np.unique(bucket_of[at_high], return_index=True)[1]]
    return np.unique(np.concatenate(([0, n - 1], first_low, first_high)))


def curve(losses: Losses, max_points: int = MAX_POINTS) -> Dict[str, Any]:
    """What /api/graphs/REF/losses returns: `steps` (all, computed or not), `computed` (how many have a loss),
    `batch` ([step index, loss] of the kept steps), `last` (the latest computed loss), `validation`
    ([index of its epoch's last step, loss] per computed validation loss)."""
    computed = np.flatnonzero(~np.isnan(losses.batch))
    kept = computed[extremes_per_bucket(losses.batch[computed], max_points)]
    validation: List[List[float]] = []
    for epoch, value in enumerate(losses.validation, start=1):
        steps = np.flatnonzero(losses.epoch == epoch)
        if not np.isnan(value) and len(steps):
            validation.append([int(steps[-1]), float(value)])   # drawn at the last step of its epoch
    last: Optional[float] = float(losses.batch[computed[-1]]) if len(computed) else None
    return {"graph": losses.graph_id, "state": losses.state, "steps": len(losses.batch), "computed": len(computed),
            "batch": [[int(i), float(losses.batch[i])] for i in kept], "last": last, "validation": validation}
