"""Picking elements by index tensors: gather (numpy.take), take_along_axis, one_hot_encoding, find_indices,
and the scatter-adds that are their gradients."""
import torch

from ..core import op_functions as R
from ..core.dtypes import is_floating
from ..core.registry import REQUIRED, register
from ..core.sizes import numel
from . import rules
from .graph_machinery import unbroadcast


def _check_int(indices, what):
    if is_floating(indices.dtype) or indices.dtype == torch.bool:
        raise TypeError(f"{what} indices must be integers, not {indices.dtype}")


# ---------------------------------------------------------------------------------------------- gather

def _gather_shape(x, indices, axis=0):
    _check_int(indices, "gather")
    if axis is None:
        return indices.shape, x.dtype
    a = rules.normalize_axis(axis, len(x.shape))
    if not x.shape:
        raise ValueError("gather needs a tensor of at least 1 dimension (or axis=None)")
    return x.shape[:a] + indices.shape + x.shape[a + 1:], x.dtype


def _wrapped(indices, size):
    """numpy.take accepts negative indices, counting from the end; index_select does not."""
    indices = indices.long()
    return torch.where(indices < 0, indices + size, indices)


def _gather_vjp(node, g, wants):
    x, indices = node.inputs
    return R.gather_backward(g, indices, axis=node.params["axis"], shape=x.shape), None


@register("gather", inputs=("x", "indices"), params={"axis": 0}, shape=_gather_shape, vjp=_gather_vjp)
def gather(x, indices, axis=0):
    """Elements of `x` at `indices` along `axis` (numpy.take; axis=None takes from the flattened x): the
    result has x's dims before `axis`, then indices' dims, then x's dims after `axis`. Negative indices
    count from the end."""
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis %= x.dim()
    picked = torch.index_select(x, axis, _wrapped(indices, x.shape[axis]).reshape(-1))
    return picked.reshape(x.shape[:axis] + indices.shape + x.shape[axis + 1:])


def _gather_backward_vjp(node, g, wants):
    _, indices = node.inputs
    return R.gather(g, indices, axis=node.params["axis"]), None


def _gather_backward_shape(g, indices, axis, shape):
    taken, _ = _gather_shape(rules.Like(shape, g.dtype), indices, axis)
    if taken != g.shape:
        raise ValueError(f"a gradient of shape {g.shape} does not fit gathering {indices.shape} "
                         f"indices from {tuple(shape)} (expected {taken})")
    return tuple(shape), g.dtype


@register("gather_backward", inputs=("g", "indices"), params={"axis": 0, "shape": REQUIRED}, method=False,
          shape=_gather_backward_shape, vjp=_gather_backward_vjp)
def gather_backward(g, indices, axis=0, shape=REQUIRED):
    """Zeros of `shape` with `g` added back where `gather` took it (repeats accumulate): its VJP."""
    shape = tuple(shape)
    flat = axis is None
    out = torch.zeros(numel(shape) if flat else shape, dtype=g.dtype, device=g.device)
    axis = 0 if flat else axis % len(shape)
    rows = g.reshape(out.shape[:axis] + (-1,) + out.shape[axis + 1:])
    out.index_add_(axis, _wrapped(indices, out.shape[axis]).reshape(-1), rows)
    return out.reshape(shape)


# ------------------------------------------------------------------------------------- take_along_axis

def _along_shape(x, indices, axis):
    _check_int(indices, "take_along_axis")
    if len(indices.shape) != len(x.shape):
        raise ValueError(f"take_along_axis needs indices with as many dims as x ({len(x.shape)}), "
                         f"not {len(indices.shape)}")
    a = rules.normalize_axis(axis, len(x.shape))
    outer = rules.broadcast(x.shape[:a] + (1,) + x.shape[a + 1:], indices.shape[:a] + (1,) + indices.shape[a + 1:])
    return outer[:a] + (indices.shape[a],) + outer[a + 1:], x.dtype


def _along_vjp(node, g, wants):
    x, indices = node.inputs
    axis = rules.normalize_axis(node.params["axis"], len(x.shape))
    return unbroadcast(R.take_along_axis_backward(g, indices, axis=axis, size=x.shape[axis]), x), None


@register("take_along_axis", inputs=("x", "indices"), params={"axis": REQUIRED}, shape=_along_shape,
          vjp=_along_vjp)
def take_along_axis(x, indices, axis):
    """x's elements at `indices` along `axis`, matched elementwise over the other dims, which broadcast
    (numpy.take_along_axis): e.g. the values that argsort/argmax indices point to."""
    return torch.take_along_dim(x, _wrapped(indices, x.shape[axis]), dim=axis)


def _along_backward_shape(g, indices, axis, size):
    a = rules.normalize_axis(axis, len(g.shape))
    if len(indices.shape) != len(g.shape) or rules.broadcast(indices.shape, g.shape) != g.shape:
        raise ValueError(f"indices of shape {indices.shape} do not fit a gradient "
                         f"of shape {g.shape}")
    return g.shape[:a] + (size,) + g.shape[a + 1:], g.dtype


@register("take_along_axis_backward", inputs=("g", "indices"), params={"axis": REQUIRED, "size": REQUIRED},
          shape=_along_backward_shape, method=False,
          vjp=lambda node, g, wants: (R.take_along_axis(g, node.inputs[1], axis=node.params["axis"]), None))
def take_along_axis_backward(g, indices, axis, size):
    """Zeros with `size` along `axis` and `g` added where take_along_axis took it: its VJP."""
    shape = g.shape[:axis % g.dim()] + (size,) + g.shape[axis % g.dim() + 1:]
    out = torch.zeros(shape, dtype=g.dtype, device=g.device)
    return out.scatter_add_(axis, _wrapped(indices, size).expand(g.shape), g)


# ------------------------------------------------------------------------------------ encoding, search

def _one_hot_shape(x, depth):
    _check_int(x, "one_hot_encoding")
    if not isinstance(depth, int) or depth < 0:
        raise ValueError(f"one_hot_encoding depth must be a non-negative int, not {depth!r}")
    return ((numel(x.shape), depth) if x.shape else (depth,)), torch.get_default_dtype()


@register("one_hot_encoding", params={"depth": REQUIRED}, shape=_one_hot_shape)
def one_hot_encoding(x, depth):
    """Rows of the depth x depth identity picked by the labels in `x`, as floats: x of shape (n,) or
    (n, 1) gives (n, depth), a 0-d label gives (depth,). As in the original, labels are flattened first.
    A label outside [0, depth) is an error when the op runs."""
    rows = torch.nn.functional.one_hot(x.reshape(-1).long(), depth).to(torch.get_default_dtype())
    return rows if x.dim() else rows.reshape(depth)


def _find_shape(x, values):
    return (numel(values.shape), -1), torch.int64


@register("find_indices", inputs=("x", "values"), shape=_find_shape)
def find_indices(x, values):
    """One row per value (of the flattened `values`), as the original's one list per value: the ascending
    int64 positions in the flattened `x` whose element equals that value. Rows are as long as the most
    matches of any value (known when the op runs); shorter ones are padded with -1."""
    matches = x.reshape(1, -1) == values.reshape(-1, 1)
    width = int(matches.sum(dim=1).max()) if matches.numel() else 0
    n = matches.shape[1]
    positions = torch.arange(n, device=x.device).expand_as(matches)
    # Non-matches sort after every position (n), and become the -1 padding.
    ordered = torch.where(matches, positions, n).sort(dim=1).values[:, :width]
    return torch.where(ordered == n, -1, ordered)
