"""Statistics with numpy's `axis`/`keepdims`: average variance std percentile median mode bincount.

Results of fractional statistics are floating point (integer inputs give the default float dtype).
"""
import torch

from ..core import op_functions as R
from ..core.dtypes import is_floating
from ..core.registry import REQUIRED, register
from . import flops, rules
from .kernel_vjp import autograd_vjp
from .reduce import expand_reduced, reduced_count


def _axes(x, axis):
    axes = rules.normalize_axes(axis, len(x.shape))
    if axis is not None and not axes and x.shape:
        raise ValueError("axis=() selects no dimension to compute the statistic over")
    return axes


def _stat_shape(x, axis=None, keepdims=False, **_):
    axes = _axes(x, axis)
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(x.shape)), rules.float_dtype(x.dtype)
    return tuple(d for i, d in enumerate(x.shape) if i not in axes), rules.float_dtype(x.dtype)


def _to_last(x, axis):
    """x with the `axis` dims moved to the end and merged into one, so one-dim torch kernels apply."""
    dims = [d % x.dim() for d in rules.kernel_dims(x, axis)] if x.dim() else []
    rest = [d for d in range(x.dim()) if d not in dims]
    return x.permute(rest + dims).reshape([x.shape[d] for d in rest] + [-1])


def _keep(out, x, axis, lead=()):
    """Reinsert the reduced dims as size 1 (keepdims) after `lead` leading result dims."""
    return out.reshape(tuple(lead) + rules.reduced_shape(tuple(x.shape), axis, True))


# ----------------------------------------------------------------------------------------------- average

def _average_shape(x, weights=None, axis=None, keepdims=False):
    if weights is not None and weights.shape != x.shape:
        if not (len(weights.shape) == 1 and isinstance(axis, int)):
            raise ValueError(f"weights of shape {weights.shape} need x's shape {x.shape}, or 1-D weights "
                             "with one int axis")
        a = rules.normalize_axis(axis, len(x.shape))
        if weights.shape[0] != x.shape[a]:
            raise ValueError(f"1-D weights of length {weights.shape[0]} do not match axis {a} of size {x.shape[a]}")
    shape, dtype = _stat_shape(x, axis, keepdims)
    if weights is not None:
        dtype = torch.promote_types(dtype, rules.float_dtype(weights.dtype))
    return shape, dtype


def _aligned_weights(w, x, axis):
    """Weights shaped to broadcast against x: 1-D weights lie along `axis`."""
    if w.shape == x.shape:
        return w
    a = rules.normalize_axis(axis, len(x.shape))
    return R.reshape(w, shape=tuple(w.shape[0] if i == a else 1 for i in range(len(x.shape))))


def _average_vjp(node, g, wants):
    if len(node.inputs) == 1:
        return (R.div(expand_reduced(g, node.inputs[0], node.params["axis"], node.params["keepdims"]),
                      float(reduced_count(node.inputs[0], node.params["axis"]))),)
    x, w = node.inputs
    axis, keepdims = node.params["axis"], node.params["keepdims"]
    wb = _aligned_weights(w, x, axis)
    total = R.sum(R.broadcast_to(wb, shape=x.shape), axis=axis, keepdims=True)
    gk = expand_reduced(g, x, axis, keepdims)
    avg = node if keepdims else R.reshape(node, shape=rules.reduced_shape(x.shape, axis, True))
    gx = R.div(R.mul(gk, wb), total)
    gw = R.div(R.mul(gk, R.sub(x, avg)), total)
    if w.shape != x.shape:
        a = rules.normalize_axis(axis, len(x.shape))
        gw = R.sum(gw, axis=tuple(i for i in range(len(x.shape)) if i != a))
    return gx, gw


@register("average", inputs=("x", "weights?"), params={"axis": None, "keepdims": False}, shape=_average_shape,
          vjp=_average_vjp)
def average(x, weights=None, axis=None, keepdims=False):
    """Weighted mean over `axis` (numpy.average): sum(x * w) / sum(w); `weights` has x's shape, or is
    1-D along one int axis; without weights it is the mean."""
    dtype = rules.float_dtype(x.dtype)
    if weights is not None:
        dtype = torch.promote_types(dtype, rules.float_dtype(weights.dtype))
    x = x.to(dtype)
    dims = rules.kernel_dims(x, axis)
    if weights is None:
        return torch.mean(x, dim=dims, keepdim=keepdims)
    w = weights.to(dtype)
    if w.shape != x.shape:
        a = axis % x.dim()
        w = w.reshape([w.shape[0] if i == a else 1 for i in range(x.dim())])
    w = w.expand(x.shape)
    return torch.sum(x * w, dim=dims, keepdim=keepdims) / torch.sum(w, dim=dims, keepdim=keepdims)


# ------------------------------------------------------------------------------------------ variance, std

SPREAD = {"axis": None, "ddof": 0, "keepdims": False}


def _centered(node):
    """(x - mean over axis, kept dims) and the divisor N - ddof of a variance node's input."""
    x = node.inputs[0]
    axis = node.params["axis"]
    centered = R.sub(x, R.mean(x, axis=axis, keepdims=True))
    return centered, float(reduced_count(x, axis) - node.params["ddof"])


def _variance_vjp(node, g, wants):
    x = node.inputs[0]
    centered, divisor = _centered(node)
    gk = expand_reduced(g, x, node.params["axis"], node.params["keepdims"])
    return (R.mul(gk, R.div(R.mul(centered, 2.0), divisor)),)


@register("variance", params=SPREAD, shape=_stat_shape, vjp=_variance_vjp, aliases=("var",))
def variance(x, axis=None, ddof=0, keepdims=False):
    """Variance over `axis` (numpy.var): mean squared deviation with divisor N - ddof."""
    x = x.to(rules.float_dtype(x.dtype))
    return torch.var(x, dim=rules.kernel_dims(x, axis), correction=ddof, keepdim=keepdims)


def _std_vjp(node, g, wants):
    x = node.inputs[0]
    axis, keepdims = node.params["axis"], node.params["keepdims"]
    centered, divisor = _centered(node)
    std = node if keepdims else R.reshape(node, shape=rules.reduced_shape(x.shape, axis, True))
    gk = expand_reduced(g, x, axis, keepdims)
    return (R.div(R.mul(gk, centered), R.mul(std, divisor)),)


@register("std", params=SPREAD, shape=_stat_shape, vjp=_std_vjp)
def std(x, axis=None, ddof=0, keepdims=False):
    """Standard deviation over `axis` (numpy.std): the square root of `variance` with the same ddof."""
    x = x.to(rules.float_dtype(x.dtype))
    return torch.std(x, dim=rules.kernel_dims(x, axis), correction=ddof, keepdim=keepdims)


# -------------------------------------------------------------------------------- percentile and median

METHODS = ("linear", "lower", "higher", "midpoint", "nearest")


def _q_shape(q):
    if isinstance(q, (int, float)) and not isinstance(q, bool):
        qs = (q,)
        shape = ()
    else:
        qs = tuple(q)
        shape = (len(qs),)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 100 for v in qs):
        raise ValueError(f"percentiles must be numbers in [0, 100], not {q!r}")
    return shape


def _percentile_shape(x, q, axis=None, keepdims=False, method="linear"):
    if method not in METHODS:
        raise ValueError(f"percentile method {method!r} is not one of {', '.join(METHODS)}")
    rules.check_nonempty_reduce(x.shape, _axes(x, axis), "percentile")
    shape, dtype = _stat_shape(x, axis, keepdims)
    return _q_shape(q) + shape, dtype


def quantiles(x, fractions, axis, keepdims, method):
    """torch.quantile over several (or all) axes at once, with numpy's result layout."""
    data = _to_last(x.to(rules.float_dtype(x.dtype)), axis)
    q = fractions.to(data.device, data.dtype) if fractions.dim() else fractions.item()
    out = torch.quantile(data, q, dim=-1, interpolation=method)
    return _keep(out, x, axis, fractions.shape) if keepdims else out


@register("percentile", params={"q": REQUIRED, "axis": None, "keepdims": False, "method": "linear"},
          shape=_percentile_shape, vjp=autograd_vjp, flops=flops.sort)
def percentile(x, q, axis=None, keepdims=False, method="linear"):
    """The q-th percentile(s) over `axis` (numpy.percentile; q a number or a list in [0, 100], whose
    dims come first in the result); `method` is linear, lower, higher, midpoint or nearest."""
    fractions = torch.tensor(q, dtype=torch.float64) / 100
    return quantiles(x, fractions, axis, keepdims, method)


def _median_shape(x, axis=None, keepdims=False):
    rules.check_nonempty_reduce(x.shape, _axes(x, axis), "median")
    return _stat_shape(x, axis, keepdims)


@register("median", params={"axis": None, "keepdims": False}, shape=_median_shape, vjp=autograd_vjp,
          flops=flops.sort)
def median(x, axis=None, keepdims=False):
    """Median over `axis` (numpy.median: the mean of the two middle values for an even count)."""
    return quantiles(x, torch.tensor(0.5, dtype=torch.float64), axis, keepdims, "linear")


def _mode_keepdims(ndim, keepdims):
    """The original's mode (scipy's of its time) gave a 1-d input's mode as shape (1,), which scripts
    concatenate; keepdims=None (the default) keeps that, and drops the axis of other inputs."""
    return ndim == 1 if keepdims is None else keepdims


def _mode_shape(x, axis=0, keepdims=None):
    if axis is not None and not isinstance(axis, int):
        raise TypeError(f"mode takes one axis (an int) or None, not {axis!r}")
    keepdims = _mode_keepdims(len(x.shape), keepdims)
    rules.check_nonempty_reduce(x.shape, rules.normalize_axes(axis, len(x.shape)), "mode")
    if axis is None:
        return ((1,) * len(x.shape) if keepdims else ()), x.dtype
    return rules.reduced_shape(x.shape, axis, keepdims), x.dtype


@register("mode", params={"axis": 0, "keepdims": None}, shape=_mode_shape, vjp=autograd_vjp, flops=flops.sort)
def mode(x, axis=0, keepdims=None):
    """The most frequent value along `axis` (scipy.stats.mode: axis 0 by default, None for the flattened
    input; the smallest value wins a tie). keepdims=None keeps the axis of a 1-d input only, as the
    original did."""
    keepdims = _mode_keepdims(x.dim(), keepdims)
    if axis is None:
        values = torch.mode(x.reshape(-1), dim=0).values
        return values.reshape((1,) * x.dim()) if keepdims else values
    return torch.mode(x, dim=axis, keepdim=keepdims).values


# ---------------------------------------------------------------------------------------------- bincount

def _bincount_shape(x, weights=None, minlength=0):
    if len(x.shape) != 1 or is_floating(x.dtype) or x.dtype == torch.bool:
        raise ValueError(f"bincount counts a 1-D tensor of non-negative ints, not {x.shape} {x.dtype}")
    if weights is not None and weights.shape != x.shape:
        raise ValueError(f"bincount weights of shape {weights.shape} must match x's shape {x.shape}")
    if not isinstance(minlength, int) or minlength < 0:
        raise ValueError(f"bincount minlength must be a non-negative int, not {minlength!r}")
    return (-1,), torch.int64 if weights is None else rules.float_dtype(weights.dtype)


def _bincount_vjp(node, g, wants):
    x = node.inputs[0]
    return (None, R.gather(g, x)) if len(node.inputs) == 2 else (None,)


@register("bincount", inputs=("x", "weights?"), params={"minlength": 0}, shape=_bincount_shape,
          vjp=_bincount_vjp)
def bincount(x, weights=None, minlength=0):
    """Occurrences of each value 0..max(x) in the 1-D int tensor `x` (numpy.bincount), or the sums of
    `weights` per value; at least `minlength` bins. Its length depends on the data."""
    if x.numel() and int(x.min()) < 0:
        raise ValueError("bincount counts non-negative ints; the input holds negative values")
    if weights is None:
        return torch.bincount(x, minlength=minlength)
    # index_add, unlike torch.bincount, is differentiable in the weights
    size = max(int(x.max()) + 1 if x.numel() else 0, minlength)
    weights = weights.to(rules.float_dtype(weights.dtype))
    return torch.zeros(size, dtype=weights.dtype, device=weights.device).index_add(0, x, weights)
