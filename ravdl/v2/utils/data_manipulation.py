"""Batching of numpy data for training loops."""
from typing import Any, Iterator, Optional, Union

import numpy as np

from ravop.core.loop_template import round_orders


def batch_iterator(X: Any, y: Any = None, batch_size: int = 64, shuffle: bool = False,
                   seed: Union[int, np.random.Generator, None] = None) -> Iterator[Any]:
    """Yield `X` (and `y`) in batches of `batch_size` rows, the last one partial: `X_batch`, or
    `(X_batch, y_batch)` when `y` is given. With `shuffle=True` the rows are visited in a random order drawn
    from `seed` (an int, or a `numpy.random.Generator` to continue across epochs)."""
    X = np.asarray(X)
    n = X.shape[0]
    if y is not None and len(y) != n:
        raise ValueError(f"X has {n} rows but y has {len(y)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, not {batch_size}")
    order = next(round_orders(n, shuffle, seed))
    for start in range(0, n, batch_size):
        rows = slice(start, start + batch_size) if order is None else order[start:start + batch_size]
        if y is None:
            yield X[rows]
        else:
            yield X[rows], np.asarray(y)[rows]
