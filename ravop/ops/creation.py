"""Ops that make a tensor from params alone: zeros and arange (numpy semantics, torch's default dtypes)."""
import math

import torch

from ..core.dtypes import as_dtype
from ..core.registry import REQUIRED, register


def _size(shape):
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in shape):
        raise ValueError(f"a shape holds non-negative ints, not {shape}")
    return shape


@register("zeros", inputs=(), params={"shape": REQUIRED, "dtype": "float32"}, method=False,
          shape=lambda shape, dtype="float32": (_size(shape), as_dtype(dtype)))
def zeros(shape, dtype="float32"):
    """A tensor of `shape` filled with zeros (numpy.zeros; float32 unless `dtype` names another)."""
    return torch.zeros(_size(shape), dtype=as_dtype(dtype))


def _arange_args(start, stop, step):
    if stop is None:
        start, stop = 0, start
    for v in (start, stop, step):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"arange takes numbers, not {v!r}")
    if step == 0:
        raise ValueError("arange step cannot be zero")
    return start, stop, step


def _arange_dtype(start, stop, step, dtype):
    if dtype is not None:
        return as_dtype(dtype)
    ints = all(isinstance(v, int) for v in (start, stop, step))
    return torch.int64 if ints else torch.get_default_dtype()


def _arange_shape(start, stop=None, step=1, dtype=None):
    start, stop, step = _arange_args(start, stop, step)
    return (max(math.ceil((stop - start) / step), 0),), _arange_dtype(start, stop, step, dtype)


@register("arange", inputs=(), params={"start": REQUIRED, "stop": None, "step": 1, "dtype": None},
          shape=_arange_shape, method=False)
def arange(start, stop=None, step=1, dtype=None):
    """Evenly spaced values in [start, stop) (numpy.arange; arange(n) counts 0..n-1): int64 for int
    arguments, else the default float dtype, unless `dtype` names one."""
    start, stop, step = _arange_args(start, stop, step)
    dtype = _arange_dtype(start, stop, step, dtype)
    if (stop - start) * step <= 0:  # torch rejects a range that runs against its step; numpy gives none
        return torch.empty(0, dtype=dtype)
    return torch.arange(start, stop, step, dtype=dtype)
