"""Shape/dtype rules shared by many ops. Pure Python and cheap: they run every time an op is recorded.

Unknown dimensions: an op whose output size depends on the data (unique, find_indices, bincount, boolean
masks) declares that dimension as -1. Rules treat -1 as "some size, known when the op runs": it broadcasts
against any size (the result is the other size, or -1 against 1), and checks that need the size (bounds,
divisibility) are skipped for it. The kernel's real output always has real sizes."""
import torch

from ..core.dtypes import is_floating, result_dtype


def broadcast(a, b):
    if a == b or not b:  # equal shapes and tensor-with-scalar are the common cases
        return a if isinstance(a, tuple) else tuple(a)   # an input's own Shape: the new op shares it
    if not a:
        return b if isinstance(b, tuple) else tuple(b)
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1 or y == -1 and x != 1:
            out.append(x)
        elif x == 1 or x == -1:
            out.append(y)
        else:
            raise ValueError(f"cannot broadcast shapes {a} and {b}")
    return tuple(out)


def broadcast_all(*shapes):
    out = shapes[0]
    for s in shapes[1:]:
        out = broadcast(out, s)
    return out


def binary(x, y, **_):
    """Elementwise op of two tensors: broadcast shapes, torch's type promotion."""
    a, b = x.shape, y.shape
    shape = a if a == b or not b else broadcast(a, b)   # broadcast's common cases, without its call
    dtype = x.dtype
    if dtype is not y.dtype:   # equal dtypes promote to themselves
        dtype = result_dtype(dtype, len(a), y.dtype, len(b))
    return shape, dtype


def binary_float(x, y, **_):
    """Like `binary`, but integer results become the default float dtype (true division, pow of floats)."""
    shape, dtype = binary(x, y)
    return shape, dtype if is_floating(dtype) else torch.get_default_dtype()


def compare(x, y, **_):
    return broadcast(x.shape, y.shape), torch.bool


def same(x, **_):
    return x.shape, x.dtype


def same_float(x, **_):
    """Unary op whose integer input gives a float result (exp, sqrt, log, ...)."""
    return x.shape, x.dtype if is_floating(x.dtype) else torch.get_default_dtype()


def same_bool(x, **_):
    return x.shape, torch.bool


def normalize_axis(axis, ndim):
    """A non-negative axis; negative axes count from the end, as in numpy."""
    n = ndim if ndim > 1 else 1
    if type(axis) is int and -n <= axis < n:  # the common case, checked cheaply first
        return axis % n
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, not {axis!r}")
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"axis {axis} is out of range for a {ndim}-d tensor")
    return axis % max(ndim, 1)


def normalize_axes(axis, ndim):
    """`None` -> every axis; int or tuple -> sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if type(axis) is int:
        return (normalize_axis(axis, ndim),)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = tuple(sorted({normalize_axis(a, ndim) for a in axes}))
    if len(out) != len(axes):
        raise ValueError(f"repeated axis in {axis!r}")
    return out


def reduced_shape(shape, axis, keepdims):
    axes = normalize_axes(axis, len(shape))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def float_dtype(dtype):
    """The dtype of a result that is fractional by nature (mean, std, ...): integers give the default float."""
    return dtype if is_floating(dtype) else torch.get_default_dtype()


def sum_dtype(dtype):
    """torch's (and numpy's) accumulator for sum/prod: bool and integer inputs accumulate in int64."""
    return dtype if is_floating(dtype) else torch.int64


def check_nonempty_reduce(shape, axes, what):
    """Reductions without an identity (max, argmax, ...) cannot reduce a dimension of size 0."""
    for a in axes:
        if shape[a] == 0:
            raise ValueError(f"{what} of a zero-size dimension (axis {a}) has no value")


def kernel_dims(x, axis):
    """Kernel side of `normalize_axes`: the dims torch should reduce, as a tuple (every dim for `None`)."""
    if axis is None:
        return tuple(range(x.dim()))
    return (axis,) if isinstance(axis, int) else tuple(axis)


class Like:
    """What a shape rule reads of a tensor (shape, dtype), for one that is not a recorded op: a slice
    `foreach` applies an op to, or the input a backward op rebuilds."""
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype
