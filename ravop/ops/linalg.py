"""Linear algebra: matmul, dot and tensordot (numpy semantics, mixed dtypes promoted as torch does) and inv."""
import torch

from ..core import op_functions as R
from ..core.dtypes import result_dtype
from ..core.registry import register
from . import flops, rules, scriptable
from .graph_machinery import unbroadcast


def _promoted(x, y):
    """torch's matmul kernels need one dtype; numpy promotes, and so do we."""
    dtype = torch.result_type(x, y)
    return x.to(dtype), y.to(dtype)


def _dtype(x, y):
    return result_dtype(x.dtype, len(x.shape), y.dtype, len(y.shape))


def _swap_last(x):
    """Transpose the last two axes (a batch of matrices)."""
    n = len(x.shape)
    return R.transpose(x, axes=tuple(range(n - 2)) + (n - 1, n - 2))


# ---------------------------------------------------------------------------------------------- matmul

def _matmul_shape(x, y):
    a, b = x.shape, y.shape
    if not a or not b:
        raise ValueError("matmul needs tensors of at least 1 dimension (use mul for scalars)")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2] and -1 not in (a2[-1], b2[-2]):
        raise ValueError(f"inner dimensions differ ({a2[-1]} vs {b2[-2]})")
    batch = rules.broadcast(a2[:-2], b2[:-2])
    shape = batch + (a2[-2],) * (len(a) > 1) + (b2[-1],) * (len(b) > 1)
    return shape, _dtype(x, y)


def _matmul_vjp(node, g, wants):
    """numpy matmul treats a 1-D operand as a row (left) or column (right) vector; do the same here,
    take the matrix gradients, sum out broadcast batch dimensions and drop the vector dimension again."""
    x, y = node.inputs
    x2 = R.reshape(x, shape=(1,) + x.shape) if len(x.shape) == 1 else x
    y2 = R.reshape(y, shape=y.shape + (1,)) if len(y.shape) == 1 else y
    batch = node.shape[:len(node.shape) - (len(x.shape) > 1) - (len(y.shape) > 1)]
    g2 = R.reshape(g, shape=batch + (x2.shape[-2], y2.shape[-1]))
    gx = unbroadcast(R.matmul(g2, _swap_last(y2)), x2)
    gy = unbroadcast(R.matmul(_swap_last(x2), g2), y2)
    return R.reshape(gx, shape=x.shape), R.reshape(gy, shape=y.shape)


@register("matmul", inputs=("x", "y"), operators=("__matmul__", "__rmatmul__"), shape=_matmul_shape, vjp=_matmul_vjp,
          flops=flops.matmul, torch_function=(torch.matmul, scriptable.no_params))
def matmul(x, y):
    """Matrix product (numpy.matmul / `@`): batch dimensions broadcast, 1-D operands are vectors."""
    return torch.matmul(*_promoted(x, y))


# ------------------------------------------------------------------------------------------- tensordot

def _tensordot_axes(axes, xdim, ydim):
    """numpy's `axes`: an int n (last n of x with first n of y) or two sequences of paired axes."""
    if isinstance(axes, int):
        if not 0 <= axes <= min(xdim, ydim):
            raise ValueError(f"tensordot axes={axes} does not fit inputs of {xdim} and {ydim} dimensions")
        return tuple(range(xdim - axes, xdim)), tuple(range(axes))
    ax, ay = axes
    ax = (ax,) if isinstance(ax, int) else tuple(ax)
    ay = (ay,) if isinstance(ay, int) else tuple(ay)
    if len(ax) != len(ay):
        raise ValueError(f"tensordot pairs axes one to one; got {len(ax)} and {len(ay)}")
    ax = tuple(rules.normalize_axis(a, xdim) for a in ax)
    ay = tuple(rules.normalize_axis(a, ydim) for a in ay)
    if len(set(ax)) != len(ax) or len(set(ay)) != len(ay):
        raise ValueError(f"repeated axis in tensordot axes {axes!r}")
    return ax, ay


def _tensordot_shape(x, y, axes=2):
    ax, ay = _tensordot_axes(axes, len(x.shape), len(y.shape))
    for a, b in zip(ax, ay):
        if x.shape[a] != y.shape[b] and -1 not in (x.shape[a], y.shape[b]):
            raise ValueError(f"axis {a} of x (size {x.shape[a]}) and axis {b} of y "
                             f"(size {y.shape[b]}) differ")
    free_x = tuple(d for i, d in enumerate(x.shape) if i not in ax)
    free_y = tuple(d for i, d in enumerate(y.shape) if i not in ay)
    return free_x + free_y, _dtype(x, y)


def _inverse(order):
    """The permutation that puts dims listed in `order` (dim j holds input axis order[j]) back in place."""
    return tuple(order.index(i) for i in range(len(order)))


def tensordot_grads(x, y, ax, ay, g):
    """Gradients of tensordot(x, y, (ax, ay)) whose output gradient is `g` (dims: x's free, then y's free)."""
    free_x = [i for i in range(len(x.shape)) if i not in ax]
    free_y = [i for i in range(len(y.shape)) if i not in ay]
    g_free_y = tuple(range(len(free_x), len(free_x) + len(free_y)))
    g_free_x = tuple(range(len(free_x)))
    # g . y over y's free dims leaves x's free dims, then y's contracted dims in ascending order.
    gx = R.tensordot(g, y, axes=(g_free_y, tuple(free_y)))
    gx = R.transpose(gx, axes=_inverse(free_x + [ax[ay.index(b)] for b in sorted(ay)]))
    # x . g over x's free dims leaves x's contracted dims in ascending order, then y's free dims.
    gy = R.tensordot(x, g, axes=(tuple(free_x), g_free_x))
    gy = R.transpose(gy, axes=_inverse([ay[ax.index(a)] for a in sorted(ax)] + free_y))
    return gx, gy


def _tensordot_vjp(node, g, wants):
    x, y = node.inputs
    ax, ay = _tensordot_axes(node.params["axes"], len(x.shape), len(y.shape))
    return tensordot_grads(x, y, ax, ay, g)


@register("tensordot", inputs=("x", "y"), params={"axes": 2}, shape=_tensordot_shape, vjp=_tensordot_vjp,
          flops=flops.contraction)
def tensordot(x, y, axes=2):
    """Sum of products over paired axes (numpy.tensordot): output dims are x's free dims, then y's."""
    ax, ay = _tensordot_axes(axes, x.dim(), y.dim())
    return torch.tensordot(*_promoted(x, y), dims=(list(ax), list(ay)))


# ------------------------------------------------------------------------------------------------- dot

def _dot_axes(x, y):
    """numpy.dot contracts x's last axis with y's second-to-last (its only axis when y is 1-D)."""
    return (len(x.shape) - 1,), (max(len(y.shape) - 2, 0),)


def _dot_shape(x, y):
    a, b = x.shape, y.shape
    if not a or not b:
        return rules.binary(x, y)
    inner = b[-2] if len(b) > 1 else b[0]
    if a[-1] != inner and a[-1] != -1 and inner != -1:
        raise ValueError(f"the last axis of x (size {a[-1]}) and the contracted axis of y (size {inner}) differ")
    return a[:-1] + b[:-2] + b[-1:] if len(b) > 1 else a[:-1], _dtype(x, y)


def _dot_vjp(node, g, wants):
    x, y = node.inputs
    if not x.shape or not y.shape:
        return unbroadcast(R.mul(g, y), x), unbroadcast(R.mul(g, x), y)
    return tensordot_grads(x, y, *_dot_axes(x, y), g)


@register("dot", inputs=("x", "y"), shape=_dot_shape, vjp=_dot_vjp, flops=flops.contraction)
def dot(x, y):
    """numpy.dot: a 0-d operand multiplies elementwise; otherwise x's last axis is summed against y's
    second-to-last (or only) axis: inner product, matrix-vector or matrix-matrix product."""
    if not x.dim() or not y.dim():
        return torch.mul(x, y)
    x, y = _promoted(x, y)
    return torch.tensordot(x, y, dims=([x.dim() - 1], [max(y.dim() - 2, 0)]))


# ------------------------------------------------------------------------------------------------- inv

def _inv_shape(x):
    if len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"inv needs square matrices (shape (..., n, n)), not {x.shape}")
    return x.shape, rules.float_dtype(x.dtype)


def _inv_vjp(node, g, wants):
    # d(A^-1) = -A^-1 dA A^-1, so the gradient is -A^-T g A^-T.
    inv_t = _swap_last(node)
    return (R.neg(R.matmul(R.matmul(inv_t, g), inv_t)),)


@register("inv", operators=("__invert__",), shape=_inv_shape, vjp=_inv_vjp, flops=flops.inverse)
def inv(x):
    """Matrix inverse of the last two dimensions (numpy.linalg.inv; `~op`); a singular matrix is an
    error when the op runs. Integer inputs give the default float dtype."""
    return torch.linalg.inv(x.to(rules.float_dtype(x.dtype)))
