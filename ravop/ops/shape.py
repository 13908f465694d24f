"""Ops that rearrange a tensor's dimensions or report them: transpose reshape expand_dims squeeze flatten
ravel reverse shape size ravint. numpy semantics; negative axes count from the end."""
import torch

from ..core import op_functions as R
from ..core.registry import REQUIRED, register
from ..core.sizes import numel
from . import rules, scriptable


def _reshape_vjp(node, g, wants):
    return (R.reshape(g, shape=node.inputs[0].shape),)


# ------------------------------------------------------------------------------------------- transpose

def _permutation(axes, ndim):
    if axes is None:
        return tuple(range(ndim - 1, -1, -1))
    if isinstance(axes, int):
        axes = (axes,)
    perm = tuple(rules.normalize_axis(a, ndim) for a in axes) if ndim else tuple(axes)
    if sorted(perm) != list(range(ndim)):
        raise ValueError(f"axes {tuple(axes)} are not a permutation of the {ndim} axes of the input")
    return perm


def _transpose_shape(x, axes=None):
    shape = x.shape
    return tuple(shape[a] for a in _permutation(axes, len(shape))), x.dtype


def _transpose_vjp(node, g, wants):
    perm = _permutation(node.params["axes"], len(node.shape))
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return (R.transpose(g, axes=tuple(inverse)),)


@register("transpose", params={"axes": None}, shape=_transpose_shape, vjp=_transpose_vjp,
          torch_function=(scriptable.transpose, scriptable.permutation))
def transpose(x, axes=None):
    """Permute the dimensions (numpy.transpose): output axis i is input axis axes[i]; None reverses them."""
    return x.permute(_permutation(axes, x.dim()))


# --------------------------------------------------------------------------------------------- reshape

def target_shape(shape, target):
    """numpy's reshape rule: `target` (an int or ints, at most one -1 to infer) for `shape`'s elements."""
    target = (target,) if type(target) is int else tuple(target)
    infer, known = [], 1
    for i, d in enumerate(target):
        if type(d) is not int or d < -1:
            raise ValueError(f"a shape holds sizes >= 0 and at most one -1, not {target}")
        if d == -1:
            infer.append(i)
        else:
            known *= d
    if len(infer) > 1:
        raise ValueError(f"can only infer one dimension (-1) of {target}")
    n = numel(shape)
    if n < 0:
        return target  # the input's size is known only at run time; -1 stays "unknown"
    if infer:
        if known == 0 or n % known:
            raise ValueError(f"cannot reshape {n} elements of shape {tuple(shape)} into {target}")
        return target[:infer[0]] + (n // known,) + target[infer[0] + 1:]
    if known != n:
        raise ValueError(f"cannot reshape {n} elements of shape {tuple(shape)} into {target}")
    return target


@register("reshape", params={"shape": REQUIRED}, shape=lambda x, shape: (target_shape(x.shape, shape), x.dtype),
          vjp=_reshape_vjp, torch_function=(scriptable.reshape, scriptable.shape_list))
def reshape(x, shape):
    """The same elements in row-major order with a new shape (numpy.reshape; one -1 is inferred)."""
    return torch.reshape(x, (shape,) if isinstance(shape, int) else tuple(shape))


def _expanded(shape, axis):
    if type(axis) is int:
        at = rules.normalize_axis(axis, len(shape) + 1)
        return shape[:at] + (1,) + shape[at:]
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    ndim = len(shape) + len(axes)
    new = rules.normalize_axes(axes, ndim)
    rest = iter(shape)
    return tuple(1 if i in new else next(rest) for i in range(ndim))


@register("expand_dims", params={"axis": 0}, shape=lambda x, axis: (_expanded(x.shape, axis), x.dtype),
          vjp=_reshape_vjp, torch_function=(scriptable.expand_dims, scriptable.same_params))
def expand_dims(x, axis=0):
    """Insert size-1 dimensions at `axis` (an int or a tuple), positions counted in the output (numpy)."""
    return x.reshape(_expanded(tuple(x.shape), axis))


def _squeezed(shape, axis):
    if axis is None:  # an unknown (-1) dimension is taken not to be 1
        return tuple(d for d in shape if d != 1)
    axes = rules.normalize_axes(axis, len(shape))
    for a in axes:
        if shape[a] not in (1, -1):
            raise ValueError(f"cannot squeeze axis {a} of size {shape[a]}: only size-1 axes can be removed")
    return tuple(d for i, d in enumerate(shape) if i not in axes)


@register("squeeze", params={"axis": None}, shape=lambda x, axis=None: (_squeezed(x.shape, axis), x.dtype),
          vjp=_reshape_vjp)
def squeeze(x, axis=None):
    """Remove size-1 dimensions: all of them, or those at `axis` (which must have size 1), as numpy."""
    return x.reshape(_squeezed(tuple(x.shape), axis))


def _flattened(shape, start_dim, end_dim):
    if not shape:
        return (1,)
    start, end = rules.normalize_axis(start_dim, len(shape)), rules.normalize_axis(end_dim, len(shape))
    if start > end:
        raise ValueError(f"start_dim {start_dim} comes after end_dim {end_dim}")
    return shape[:start] + (numel(shape[start:end + 1]),) + shape[end + 1:]


@register("flatten", params={"start_dim": 0, "end_dim": -1}, vjp=_reshape_vjp,
          shape=lambda x, start_dim=0, end_dim=-1: (_flattened(x.shape, start_dim, end_dim), x.dtype),
          torch_function=(scriptable.flatten, scriptable.same_params))
def flatten(x, start_dim=0, end_dim=-1):
    """Merge dimensions start_dim..end_dim into one (torch.flatten); the default gives numpy's 1-D
    `flatten`. A 0-d input gives shape (1,)."""
    return torch.flatten(x, start_dim, end_dim) if x.dim() else x.reshape(1)


def _ravel_shape(x, order="C"):
    if order not in ("C", "F"):
        raise ValueError(f"ravel order must be 'C' (row-major) or 'F' (column-major), not {order!r}")
    return (numel(x.shape),), x.dtype


def _ravel_vjp(node, g, wants):
    x = node.inputs[0]
    if node.params["order"] == "C":
        return (R.reshape(g, shape=x.shape),)
    return (R.transpose(R.reshape(g, shape=x.shape[::-1])),)


@register("ravel", params={"order": "C"}, shape=_ravel_shape, vjp=_ravel_vjp)
def ravel(x, order="C"):
    """The elements as a 1-D tensor, in row-major ('C') or column-major ('F') order (numpy.ravel)."""
    if order == "F":
        x = x.permute(tuple(range(x.dim() - 1, -1, -1)))
    return x.reshape(-1)


def _reverse_shape(x, axis=None):
    rules.normalize_axes(axis, len(x.shape))
    return x.shape, x.dtype


@register("reverse", params={"axis": None}, shape=_reverse_shape,
          vjp=lambda node, g, wants: (R.reverse(g, axis=node.params["axis"]),))
def reverse(x, axis=None):
    """Reverse the order of elements along `axis` (an int, a tuple, or None for every axis): numpy.flip."""
    dims = rules.kernel_dims(x, axis)
    return torch.flip(x, dims) if dims else x


# ----------------------------------------------------------------------------------- facts about shape

def _shape_shape(x, index=None):
    if index is None:
        return (len(x.shape),), torch.int64
    rules.normalize_axis(index, len(x.shape))
    return (), torch.int64


@register("shape", params={"index": None}, shape=_shape_shape)
def shape(x, index=None):
    """The input's shape as a 1-D int64 tensor, or with `index` the size of that one dimension (0-d)."""
    if index is None:
        return torch.tensor(tuple(x.shape), dtype=torch.int64, device=x.device)
    return torch.tensor(x.shape[index], dtype=torch.int64, device=x.device)


@register("size", shape=lambda x: ((), torch.int64))
def size(x):
    """The number of elements, as a 0-d int64 tensor (numpy.size)."""
    return torch.tensor(x.numel(), dtype=torch.int64, device=x.device)


@register("ravint", shape=lambda x: (x.shape, torch.int64))
def ravint(x):
    """Convert to int64 elementwise, truncating toward zero as Python's int() does."""
    return x.to(torch.int64)
