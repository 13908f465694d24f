"""Dtype names on the wire, and torch's type promotion computed once per combination and cached."""
import numpy as np
import torch

DTYPES = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
NAMES = {dtype: name for name, dtype in DTYPES.items()}


def dtype_from_name(name):
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


def as_dtype(value):
    """Accept a torch dtype, a dtype name, or a numpy dtype or scalar type (np.float32)."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, type):  # np.float32, float, int, bool
        value = np.dtype(value)
    return dtype_from_name(str(getattr(value, "name", value)))


_promotions = {}


def result_dtype(a_dtype, a_ndim, b_dtype, b_ndim):
    """The dtype torch gives a binary op of two tensors (0-dim tensors promote as torch's "scalars" do)."""
    key = (a_dtype, a_ndim == 0, b_dtype, b_ndim == 0)
    hit = _promotions.get(key)
    if hit is None:
        a = torch.zeros(() if a_ndim == 0 else (1,), dtype=a_dtype)
        b = torch.zeros(() if b_ndim == 0 else (1,), dtype=b_dtype)
        hit = _promotions[key] = torch.result_type(a, b)
    return hit


def is_floating(dtype):
    return dtype.is_floating_point or dtype.is_complex
