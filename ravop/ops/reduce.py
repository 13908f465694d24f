"""Reductions with numpy's `axis` (None, an int or a tuple; negative counts from the end) and `keepdims`:
sum prod mean min max argmax argmin.

numpy's `axis=()` reduces nothing; torch's `dim=()` reduces everything, so kernels treat it explicitly.
"""
import torch

from ..core import op_functions as R
from ..core.registry import register
from ..core.sizes import numel
from . import rules, scriptable
from .kernel_vjp import autograd_vjp

AXIS = {"axis": None, "keepdims": False}


def _reduction(dtype_of, nonempty=None):
    """Shape rule of a reduction whose result dtype is `dtype_of(input dtype)`; `nonempty` names a
    reduction without an identity, which cannot reduce a zero-size dimension."""
    def rule(x, axis=None, keepdims=False, **_):
        axes = rules.normalize_axes(axis, len(x.shape))
        if nonempty:
            rules.check_nonempty_reduce(x.shape, axes, nonempty)
        if keepdims:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return shape, dtype_of(x.dtype)
    return rule


def _same(dtype):
    return dtype


def expand_reduced(g, x, axis, keepdims):
    """A gradient of a reduction's output shape, broadcast back over the reduced axes of input `x`."""
    if not keepdims:
        g = R.reshape(g, shape=rules.reduced_shape(x.shape, axis, True))
    return R.broadcast_to(g, shape=x.shape)


def reduced_count(x, axis):
    """How many elements each output of a reduction over `axis` combines (known at record time)."""
    n = numel(tuple(x.shape[a] for a in rules.normalize_axes(axis, len(x.shape))))
    if n < 0:
        raise ValueError(f"the gradient of a mean over a dimension of unknown size is not supported "
                         f"(input shape {x.shape})")
    return n


# ------------------------------------------------------------------------------------------------- sum

def _sum_vjp(node, g, wants):
    return (expand_reduced(g, node.inputs[0], node.params["axis"], node.params["keepdims"]),)


@register("sum", params=AXIS, shape=_reduction(rules.sum_dtype), vjp=_sum_vjp,
          torch_function=(scriptable.reduce_sum, scriptable.reduction))
def sum_(x, axis=None, keepdims=False):
    """Sum over `axis` (numpy.sum); bool and integer inputs sum in int64."""
    dims = rules.kernel_dims(x, axis)
    if not dims and x.dim():
        return x.to(rules.sum_dtype(x.dtype))
    return torch.sum(x, dim=dims, keepdim=keepdims)


@register("prod", params=AXIS, shape=_reduction(rules.sum_dtype), vjp=autograd_vjp)
def prod(x, axis=None, keepdims=False):
    """Product over `axis` (numpy.prod); bool and integer inputs multiply in int64. Its gradient is
    torch's, which stays exact when the input holds zeros."""
    if not x.dim():
        return torch.prod(x)
    dims = rules.kernel_dims(x, axis)
    if not dims:
        return x.to(rules.sum_dtype(x.dtype))
    for d in sorted((d % x.dim() for d in dims), reverse=True):  # torch.prod takes one dim at a time
        x = torch.prod(x, dim=d, keepdim=keepdims)
    return x


def _mean_vjp(node, g, wants):
    x = node.inputs[0]
    axis = node.params["axis"]
    return (R.div(expand_reduced(g, x, axis, node.params["keepdims"]), float(reduced_count(x, axis))),)


@register("mean", params=AXIS, shape=_reduction(rules.float_dtype), vjp=_mean_vjp,
          torch_function=(scriptable.reduce_mean, scriptable.reduction))
def mean(x, axis=None, keepdims=False):
    """Arithmetic mean over `axis` (numpy.mean); integer inputs give the default float dtype. The mean
    of an empty selection is nan, as in numpy."""
    x = x.to(rules.float_dtype(x.dtype))
    dims = rules.kernel_dims(x, axis)
    if not dims and x.dim():
        return x
    return torch.mean(x, dim=dims, keepdim=keepdims)


# ----------------------------------------------------------------------------------------- min and max

def _extreme_shape(what):
    values = _reduction(_same, nonempty=what)

    def rule(x, axis=None, keepdims=False, return_indices=False):
        shape, dtype = values(x, axis, keepdims)
        if not return_indices:
            return shape, dtype
        if axis is not None and not isinstance(axis, int):
            raise TypeError(f"{what} with return_indices=True takes one axis (an int) or None, not {axis!r}")
        return [(shape, dtype), (shape, torch.int64)]
    return rule


def _extreme_vjp(node, g, wants):
    x = node.inputs[0]
    axis, keepdims = node.params["axis"], node.params["keepdims"]
    if node.params["return_indices"]:
        g_values, indices = g[0], node.output(1)
        if g_values is None:
            return (None,)
        if axis is None:  # the kernel reduced the flattened input
            flat = R.take_along_axis_backward(R.reshape(g_values, shape=(1,)), R.reshape(indices, shape=(1,)),
                                              axis=0, size=numel(x.shape))
            return (R.reshape(flat, shape=x.shape),)
        if not keepdims:
            g_values = R.expand_dims(g_values, axis=axis)
            indices = R.expand_dims(indices, axis=axis)
        return (R.take_along_axis_backward(g_values, indices, axis=axis, size=x.shape[axis]),)
    # Without indices the gradient is shared evenly among tied extremes, as torch.amax/amin do.
    kept = node if keepdims else R.reshape(node, shape=rules.reduced_shape(x.shape, axis, True))
    mask = R.equal(x, kept)
    share = R.div(expand_reduced(g, x, axis, keepdims), R.sum(mask, axis=axis, keepdims=True))
    return (R.where(mask, share, 0.0),)


def _extreme_kernel(values, with_indices):
    def kernel(x, axis=None, keepdims=False, return_indices=False):
        if return_indices:
            if axis is not None:
                return tuple(with_indices(x, dim=axis, keepdim=keepdims))
            v, i = with_indices(x.reshape(-1), dim=0)
            ones = (1,) * x.dim() if keepdims else ()
            return v.reshape(ones), i.reshape(ones)
        dims = rules.kernel_dims(x, axis)
        if not dims and x.dim():
            return x
        return values(x, dim=dims, keepdim=keepdims)
    return kernel


def _doc(kernel, text):
    kernel.__doc__ = text
    return kernel


register("max", params={**AXIS, "return_indices": False}, shape=_extreme_shape("max"), vjp=_extreme_vjp)(_doc(
    _extreme_kernel(torch.amax, torch.max),
    """Largest value over `axis` (numpy.max). With `return_indices=True` (one int axis, or None for the
    flattened input) it returns (values, int64 indices of a largest value along that axis)."""))
register("min", params={**AXIS, "return_indices": False}, shape=_extreme_shape("min"), vjp=_extreme_vjp)(_doc(
    _extreme_kernel(torch.amin, torch.min),
    """Smallest value over `axis` (numpy.min). With `return_indices=True` (one int axis, or None for the
    flattened input) it returns (values, int64 indices of a smallest value along that axis)."""))


def _arg_shape(what):
    def rule(x, axis=None, keepdims=False):
        if axis is not None and not isinstance(axis, int):
            raise TypeError(f"{what} takes one axis (an int) or None, not {axis!r}")
        axes = rules.normalize_axes(axis, len(x.shape))
        rules.check_nonempty_reduce(x.shape, axes, what)
        if axis is None:
            return ((1,) * len(x.shape) if keepdims else ()), torch.int64
        return rules.reduced_shape(x.shape, axis, keepdims), torch.int64
    return rule


@register("argmax", params=AXIS, shape=_arg_shape("argmax"))
def argmax(x, axis=None, keepdims=False):
    """int64 index of the first largest value along `axis` (numpy.argmax; None: of the flattened input)."""
    return torch.argmax(x, dim=axis, keepdim=keepdims)


@register("argmin", params=AXIS, shape=_arg_shape("argmin"))
def argmin(x, axis=None, keepdims=False):
    """int64 index of the first smallest value along `axis` (numpy.argmin; None: of the flattened input)."""
    return torch.argmin(x, dim=axis, keepdim=keepdims)
