"""Sizes of tensors from their declared shapes and dtypes, in the two meanings the system needs: exact (shape
rules, where an unknown size must stay unknown) and as an estimate (the cost model, a worker's memory checks)."""


def numel(shape):
    """Number of elements; -1 when a dimension is data-dependent (-1, known only when the op runs)."""
    n = 1
    for d in shape:
        if d < 0:
            return -1
        n *= d
    return n


def numel_estimate(shape):
    """Number of elements, counting a data-dependent (-1) dimension as 1: what can be known before the run."""
    n = 1
    for d in shape:
        if d > 1:
            n *= d
        elif d == 0:
            return 0
    return n


def nbytes_estimate(shape, dtype):
    """Bytes of a tensor of `shape` and torch `dtype`, by `numel_estimate`."""
    return numel_estimate(shape) * dtype.itemsize
