"""Backward ops that compute only the gradients asked for.

A layer-level backward op (linear_backward, conv2d_backward, the losses' backward ops, ...) takes a `mask`
param, one bool per differentiable input, and has one output per True entry. Its VJP builds the mask from
what the running `R.grad` wants (`vjp(node, g, wants)`: `wants(op)` is False for an input no requested gradient
depends on), records the op, and maps its outputs back to one gradient or None per input.
"""
from itertools import compress


def backward_mask(wants, *inputs):
    """The backward-op `mask` param: which of these inputs (None = absent) the running grad `wants`."""
    return tuple(i is not None and wants(i) for i in inputs)


def call_backward(backward_op, mask, *args, **params):
    """Record `backward_op(*args, mask=mask, **params)` and map its outputs (one per True in `mask`) back
    to one gradient or None per entry of `mask`."""
    if not any(mask):
        return (None,) * len(mask)
    outputs = iter(backward_op(*args, mask=mask, **params))
    return tuple(next(outputs) if wanted else None for wanted in mask)


def masked_shapes(mask, *likes):
    """Shape rule of a backward op: the shape and dtype of each input whose gradient `mask` asks for."""
    return [(like.shape, like.dtype) for wanted, like in zip(mask, likes) if wanted]


def keep_masked(mask, *grads):
    """A backward kernel's result: the gradients `mask` asks for, in order (compress: no Python frame per
    gradient, a loop step runs ~10 backward kernels)."""
    return tuple(compress(grads, mask))
