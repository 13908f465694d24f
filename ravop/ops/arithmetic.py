"""Elementwise arithmetic: add sub mul div pow neg pos abs sign round exp natlog square cube square_root cube_root
clip."""
import torch

from ..core import op_functions as R
from ..core.registry import register
from . import rules, scriptable
from .graph_machinery import unbroadcast


def _add_vjp(node, g, wants):
    x, y = node.inputs
    return unbroadcast(g, x), unbroadcast(g, y)


def _sub_vjp(node, g, wants):
    x, y = node.inputs
    return unbroadcast(g, x), unbroadcast(R.neg(g), y)


def _mul_vjp(node, g, wants):
    x, y = node.inputs
    return unbroadcast(R.mul(g, y), x), unbroadcast(R.mul(g, x), y)


def _div_vjp(node, g, wants):
    x, y = node.inputs
    gx = R.div(g, y)
    return unbroadcast(gx, x), unbroadcast(R.neg(R.mul(gx, node)), y)


def _pow_vjp(node, g, wants):
    x, y = node.inputs
    gx = R.mul(g, R.mul(y, R.pow(x, R.sub(y, 1))))
    gy = R.mul(g, R.mul(node, R.natlog(x)))
    return unbroadcast(gx, x), unbroadcast(gy, y)


# An op whose kernel is a torch function with the same arguments is exported as that function.
SAME = scriptable.no_params
register("add", inputs=("x", "y"), operators=("__add__", "__radd__"), shape=rules.binary, vjp=_add_vjp,
         torch_function=(torch.add, SAME))(torch.add)
register("sub", inputs=("x", "y"), operators=("__sub__", "__rsub__"), shape=rules.binary, vjp=_sub_vjp,
         aliases=("subtract",), torch_function=(torch.sub, SAME))(torch.sub)
register("mul", inputs=("x", "y"), operators=("__mul__", "__rmul__"), shape=rules.binary, vjp=_mul_vjp,
         aliases=("multiply",), torch_function=(torch.mul, SAME))(torch.mul)
register("div", inputs=("x", "y"), operators=("__truediv__", "__rtruediv__"), shape=rules.binary_float, vjp=_div_vjp,
         aliases=("divide",), torch_function=(torch.div, SAME))(torch.div)
register("pow", inputs=("x", "y"), operators=("__pow__", "__rpow__"), shape=rules.binary, vjp=_pow_vjp,
         aliases=("power",))(torch.pow)

register("neg", operators=("__neg__",), shape=rules.same, vjp=lambda node, g, wants: (R.neg(g),),
         torch_function=(torch.neg, SAME))(torch.neg)
register("pos", operators=("__pos__",), shape=rules.same, vjp=lambda node, g, wants: (g,))(torch.positive)
register("abs", operators=("__abs__",), shape=rules.same,
         vjp=lambda node, g, wants: (R.mul(g, R.sign(node.inputs[0])),))(torch.abs)
# sign is flat wherever it is differentiable: its gradient is zero (None: no contribution), as torch's.
register("sign", shape=rules.same, vjp=lambda node, g, wants: (None,))(torch.sign)
# round (half to even, as torch.round): flat wherever it is differentiable, like sign. int8 compression of
# pseudo-gradients rounds (ravop/parallel/compression.py).
@register("round", shape=rules.same, vjp=lambda node, g, wants: (None,))
def round_(x):
    """x rounded to the nearest integer, ties to even (torch.round); its gradient is zero, as torch's."""
    return torch.round(x)
register("exp", shape=rules.same_float, vjp=lambda node, g, wants: (R.mul(g, node),),
         torch_function=(torch.exp, SAME))(torch.exp)
register("natlog", shape=rules.same_float, vjp=lambda node, g, wants: (R.div(g, node.inputs[0]),),
         aliases=("log",), torch_function=(torch.log, SAME))(torch.log)
register("square", shape=rules.same, vjp=lambda node, g, wants: (R.mul(g, R.mul(node.inputs[0], 2.0)),),
         torch_function=(torch.square, SAME))(torch.square)
register("square_root", shape=rules.same_float, vjp=lambda node, g, wants: (R.div(g, R.mul(node, 2.0)),),
         aliases=("sqrt",), torch_function=(torch.sqrt, SAME))(torch.sqrt)


@register("cube", shape=rules.same, vjp=lambda node, g, wants: (R.mul(g, R.mul(R.square(node.inputs[0]), 3.0)),))
def cube(x):
    return x * x * x


@register("cube_root", shape=rules.same_float, vjp=lambda node, g, wants: (R.div(g, R.mul(R.square(node), 3.0)),))
def cube_root(x):
    """Real cube root, negative inputs included (numpy's cbrt)."""
    x = x if x.is_floating_point() else x.to(torch.get_default_dtype())
    return torch.sign(x) * torch.abs(x).pow(1.0 / 3.0)


def _clip_shape(x, lower_limit=None, upper_limit=None):
    bounds = [b for b in (lower_limit, upper_limit) if b is not None]
    if any(isinstance(b, bool) or not isinstance(b, (int, float)) for b in bounds):
        raise TypeError(f"clip limits must be numbers or None, not {lower_limit!r}, {upper_limit!r}")
    if len(bounds) == 2 and lower_limit > upper_limit:
        raise ValueError(f"clip lower_limit {lower_limit} is above upper_limit {upper_limit}")
    if any(isinstance(b, float) for b in bounds):
        return x.shape, rules.float_dtype(x.dtype)
    return x.shape, x.dtype


def _clip_vjp(node, g, wants):
    # Inside [lower, upper] (bounds included, as torch.clamp) the gradient passes through; outside it is 0.
    x = node.inputs[0]
    lower, upper = node.params["lower_limit"], node.params["upper_limit"]
    inside = None
    for bound, test in ((lower, R.greater_equal), (upper, R.less_equal)):
        if bound is not None:
            mask = test(x, bound)
            inside = mask if inside is None else R.logical_and(inside, mask)
    return (g if inside is None else R.where(inside, g, 0.0),)


@register("clip", params={"lower_limit": None, "upper_limit": None}, shape=_clip_shape, vjp=_clip_vjp)
def clip(x, lower_limit=None, upper_limit=None):
    """Limit values to [lower_limit, upper_limit] (numpy.clip; either limit may be None). A float limit
    makes an integer input float."""
    if lower_limit is None and upper_limit is None:
        return x.clone()
    return torch.clamp(x, lower_limit, upper_limit)
