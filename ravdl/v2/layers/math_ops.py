"""The original's math layers (Add, Subtract, Multiply, Division, Power, Dot, Transpose, Reshape, Concat),
used by models written from raw operations such as its GPT: each applies one op to its inputs and holds
nothing to learn. `Add()._forward_pass(a, b)` records `a + b`, as `R.add(a, b)` would."""
from typing import Any, Optional, Sequence

import ravop as R

from .base import Flag, Layer, Shape, as_input, flag


class OpLayer(Layer):
    """A layer that applies one op: nothing to build or train, and no torch module of its own (a saved model
    applies the op itself). Floating inputs are cast to float32, as every layer's; integers stay."""
    built = True   # nothing to build: a plain attribute over Layer's property

    def _forward_pass(self, *inputs: Any, training: bool = True, **params: Any) -> R.Op:
        out = self.apply(*(self.cast_input(as_input(X)) for X in inputs), **params)
        self.last_output_shape = tuple(out.shape[1:])
        return out

    def cast_input(self, X: R.Op) -> R.Op:
        return super().cast_input(X) if X.dtype.is_floating_point else X

    def apply(self, *inputs: Any) -> R.Op:
        raise NotImplementedError

    def output_shape(self, input_shape: Shape) -> Shape:
        return self.last_output_shape or input_shape

    def torch_spec(self) -> None:
        return None


class Add(OpLayer):
    def apply(self, x1: R.Op, x2: R.Op) -> R.Op:
        return R.add(x1, x2)


class Subtract(OpLayer):
    def apply(self, x1: R.Op, x2: R.Op) -> R.Op:
        return R.sub(x1, x2)


class Multiply(OpLayer):
    def apply(self, x1: R.Op, x2: R.Op) -> R.Op:
        return R.mul(x1, x2)


class Division(OpLayer):
    def apply(self, x1: R.Op, x2: R.Op) -> R.Op:
        return R.div(x1, x2)


class Power(OpLayer):
    def apply(self, X: R.Op, power: Any = None) -> R.Op:
        if power is None:
            raise ValueError("Power._forward_pass(X, power=...) needs the power")
        return R.pow(X, power)


class Dot(OpLayer):
    """Matrix product over the last two dimensions, batched over the others (torch.matmul)."""

    def apply(self, x1: R.Op, x2: R.Op) -> R.Op:
        return R.matmul(x1, x2)


class Transpose(OpLayer):
    """`axes` of two dimensions swaps them (torch.transpose, as the original: axes=(-2, -1) transposes the last
    two, also of a 2-d input); longer permutations permute (numpy.transpose); None reverses every dimension."""

    def apply(self, X: R.Op, axes: Optional[Sequence[int]] = None) -> R.Op:
        if axes is not None and len(axes) == 2:
            first, second = (a % X.ndim for a in axes)
            permutation = list(range(X.ndim))
            permutation[first], permutation[second] = second, first
            axes = tuple(permutation)
        return R.transpose(X, axes=None if axes is None else tuple(axes))


class Reshape(OpLayer):
    """`_forward_pass(X, shape=(...))`; the result is always contiguous, so `contiguous` changes nothing."""

    def __init__(self, contiguous: Flag = "False") -> None:
        super().__init__()
        self.contiguous = flag(contiguous, "contiguous")

    def apply(self, X: R.Op, shape: Optional[Sequence[int]] = None) -> R.Op:
        if shape is None:
            raise ValueError("Reshape._forward_pass(X, shape=...) needs the shape")
        return R.reshape(X, shape=tuple(shape))


class Concat(OpLayer):
    def apply(self, x1: R.Op, x2: R.Op, axis: int = -1) -> R.Op:
        return R.concat([x1, x2], axis=axis)
