"""`R.t` and the named constants of the original API."""
import math

from .graph import current_graph, to_tensor
from .source import user_source


def t(value, dtype=None):
    """A constant tensor op from a list, numpy array, number or torch tensor."""
    tensor = to_tensor(value)
    if dtype is not None:
        from .dtypes import as_dtype
        tensor = tensor.to(as_dtype(dtype))
    return current_graph().constant(tensor, user_source())


Tensor = t
Scalar = t


def epsilon():
    return t(1e-07)


def one():
    return t(1)


def minus_one():
    return t(-1)


def inf():
    return t(math.inf)


def pi():
    return t(math.pi)
