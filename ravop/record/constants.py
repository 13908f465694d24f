"""`R.t`, `R.Tensor`, `R.Scalar` and the named constants of the original API.

A function here annotated `-> Op`, and a class whose `__new__` is, are written into ravop/__init__.pyi with their
signatures (scripts/gen_stubs.py), so that a type checker and an IDE know that `R.t(...)` and `R.Tensor(...)` have
the op methods (`.reshape`, `.sum`, ...)."""
from __future__ import annotations

import math
from typing import Any

from ..core.registry import INPUTS
from .graph import Op, current_graph, to_tensor
from .source import user_source

# The original's `dtype='ndarray'` said "the value is an array": keep the value's own dtype.
KEEP_DTYPE = (None, "ndarray")


def t(value: Any, dtype: Any = None, name: str | None = None) -> Op:
    """A constant tensor op from a list, numpy array, number or torch tensor (an Op is returned as it is).
    `dtype` converts it (a torch/numpy dtype or its name); `name` labels the op (its repr, `op.name`).
    A torch tensor or a C-contiguous numpy array of a supported dtype is used as it is, not copied (as
    torch.from_numpy): R.activate() uploads what it holds then."""
    if isinstance(value, Op):
        return value
    tensor = to_tensor(value)
    if dtype not in KEEP_DTYPE:
        from ..core.dtypes import as_dtype
        tensor = tensor.to(as_dtype(dtype))
    graph = current_graph()
    op = graph.constant(tensor, user_source())
    if name is not None:
        graph.label(op, name)
    return op


class _ConstantKind(type):
    """`isinstance(x, R.Tensor)` is true for the constants `R.t`/`R.Tensor`/`R.Scalar` make, as the original's
    Tensor class was (computed values are `R.Op`s); `R.Scalar` also needs a 0-d constant."""

    def __instancecheck__(cls, value):
        return isinstance(value, Op) and value.op in INPUTS and (not cls.scalar or value.shape == ())


class Tensor(metaclass=_ConstantKind):
    """`R.Tensor(value, dtype=None, name=None)`: the same as `R.t`, a constant Op (a class only so that
    `isinstance(x, R.Tensor)` tells a constant, as the original's Tensor class did)."""
    scalar = False

    def __new__(cls, value: Any, dtype: Any = None, name: str | None = None) -> Op:   # type: ignore[misc]
        return t(value, dtype, name)


class Scalar(metaclass=_ConstantKind):
    """`R.Scalar(number, dtype=None, name=None)`: a 0-d constant Op (`isinstance(x, R.Scalar)` tells one)."""
    scalar = True

    def __new__(cls, value: Any, dtype: Any = None, name: str | None = None) -> Op:   # type: ignore[misc]
        op = t(value, dtype, name)
        if op.shape != ():
            raise ValueError(f"R.Scalar takes one number, not a value of shape {tuple(op.shape)}")
        return op


def epsilon() -> Op:
    """1e-07, a constant op (the original's R.epsilon())."""
    return t(1e-07)


def one() -> Op:
    """1, a constant op."""
    return t(1)


def minus_one() -> Op:
    """-1, a constant op."""
    return t(-1)


def inf() -> Op:
    """+inf, a constant op."""
    return t(math.inf)


def pi() -> Op:
    """pi, a constant op."""
    return t(math.pi)
