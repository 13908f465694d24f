"""Random ops. Each draws from the `generator=` the runner seeds from the graph seed and the op's id,
so a re-run or a retry on another worker gives the same numbers, and two ops give different ones."""
import torch

from ..core.dtypes import as_dtype
from ..core.registry import REQUIRED, register
from .creation import _size


def _float(dtype):
    dtype = as_dtype(dtype)
    if not dtype.is_floating_point:
        raise ValueError(f"random values are floats; {dtype} is not a floating-point dtype")
    return dtype


@register("random", inputs=(), params={"size": REQUIRED, "dtype": "float32"}, random=True, method=False,
          shape=lambda size, dtype="float32": (_size(size), _float(dtype)))
def random(size, dtype="float32", *, generator):
    """Uniform samples in [0, 1) of shape `size` (numpy.random.random)."""
    return torch.rand(_size(size), generator=generator, dtype=as_dtype(dtype), device=generator.device)


def _uniform_shape(low=0.0, high=1.0, size=REQUIRED, dtype="float32"):
    if not low <= high:
        raise ValueError(f"random_uniform needs low <= high, got low={low} high={high}")
    return _size(size), _float(dtype)


@register("random_uniform", inputs=(), params={"low": 0.0, "high": 1.0, "size": REQUIRED, "dtype": "float32"},
          random=True, method=False, shape=_uniform_shape)
def random_uniform(low=0.0, high=1.0, size=REQUIRED, dtype="float32", *, generator):
    """Uniform samples in [low, high) of shape `size` (numpy.random.uniform)."""
    out = torch.empty(_size(size), dtype=as_dtype(dtype), device=generator.device)
    return out.uniform_(low, high, generator=generator)
