"""Ordering ops: sort (optionally with indices), argsort and unique (optionally with inverse and counts).

Sorting is stable, so tied elements keep their order and sort's gradient goes where argsort points.
"""
import torch

from ..core import op_functions as R
from ..core.registry import register
from ..core.sizes import numel
from . import flops, rules


def _sort_axis(x, axis):
    if axis is None:
        return None
    if not isinstance(axis, int):
        raise TypeError(f"sort takes one axis (an int) or None, not {axis!r}")
    return rules.normalize_axis(axis, len(x.shape))


def _sort_shape(x, axis=-1, return_indices=False):
    a = _sort_axis(x, axis)
    shape = (numel(x.shape),) if a is None else x.shape
    return [(shape, x.dtype), (shape, torch.int64)] if return_indices else (shape, x.dtype)


def _sort_vjp(node, g, wants):
    x = node.inputs[0]
    axis = node.params["axis"]
    if node.params["return_indices"]:
        g, indices = g[0], node.output(1)
        if g is None:
            return (None,)
    else:
        indices = R.argsort(x, axis=axis)
    if axis is None:
        flat = R.take_along_axis_backward(g, indices, axis=0, size=numel(x.shape))
        return (R.reshape(flat, shape=x.shape),)
    return (R.take_along_axis_backward(g, indices, axis=axis, size=x.shape[axis]),)


@register("sort", params={"axis": -1, "return_indices": False}, shape=_sort_shape, vjp=_sort_vjp, flops=flops.sort)
def sort(x, axis=-1, return_indices=False):
    """Ascending values along `axis` (numpy.sort; axis=None sorts the flattened input). With
    `return_indices=True` it returns (values, int64 indices into the input), as torch.sort."""
    if axis is None:
        x, axis = x.reshape(-1), 0
    values, indices = torch.sort(x, dim=axis, stable=True)
    return (values, indices) if return_indices else values


@register("argsort", params={"axis": -1}, flops=flops.sort,
          shape=lambda x, axis=-1: (_sort_shape(x, axis)[0], torch.int64))
def argsort(x, axis=-1):
    """int64 indices that sort `x` along `axis` (numpy.argsort, stable; axis=None: the flattened input)."""
    if axis is None:
        x, axis = x.reshape(-1), 0
    return torch.argsort(x, dim=axis, stable=True)


def _unique_shape(x, return_inverse=False, return_counts=False, axis=None):
    if axis is None:
        values = ((-1,), x.dtype)
        inverse = (x.shape, torch.int64)
    else:
        a = rules.normalize_axis(axis, len(x.shape))
        values = (x.shape[:a] + (-1,) + x.shape[a + 1:], x.dtype)
        inverse = ((x.shape[a],), torch.int64)
    if not return_inverse and not return_counts:
        return values
    return [values] + [inverse] * bool(return_inverse) + [((-1,), torch.int64)] * bool(return_counts)


@register("unique", params={"return_inverse": False, "return_counts": False, "axis": None}, shape=_unique_shape,
          flops=flops.sort)
def unique(x, return_inverse=False, return_counts=False, axis=None):
    """Sorted distinct values (numpy.unique; of the flattened input, or distinct slices along `axis`).
    With `return_inverse` / `return_counts` it also returns, in that order, the int64 position of each
    input element (or slice) in the values, and how often each value occurs. Sizes depend on the data."""
    out = torch.unique(x, sorted=True, return_inverse=True, return_counts=True, dim=axis)
    values, inverse, counts = out
    picked = (values,) + (inverse,) * bool(return_inverse) + (counts,) * bool(return_counts)
    return picked if len(picked) > 1 else values
