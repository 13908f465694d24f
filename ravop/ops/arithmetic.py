"""Elementwise arithmetic: add sub mul div pow neg pos abs exp natlog square cube square_root cube_root."""
import torch

from .. import functional as F
from ..registry import register
from . import rules
from .core import unbroadcast


def _add_vjp(node, g):
    x, y = node.inputs
    return unbroadcast(g, x), unbroadcast(g, y)


def _sub_vjp(node, g):
    x, y = node.inputs
    return unbroadcast(g, x), unbroadcast(F.neg(g), y)


def _mul_vjp(node, g):
    x, y = node.inputs
    return unbroadcast(F.mul(g, y), x), unbroadcast(F.mul(g, x), y)


def _div_vjp(node, g):
    x, y = node.inputs
    gx = F.div(g, y)
    return unbroadcast(gx, x), unbroadcast(F.neg(F.mul(gx, node)), y)


def _pow_vjp(node, g):
    x, y = node.inputs
    gx = F.mul(g, F.mul(y, F.pow(x, F.sub(y, 1))))
    gy = F.mul(g, F.mul(node, F.natlog(x)))
    return unbroadcast(gx, x), unbroadcast(gy, y)


register("add", inputs=("x", "y"), shape=rules.binary, vjp=_add_vjp)(torch.add)
register("sub", inputs=("x", "y"), shape=rules.binary, vjp=_sub_vjp, aliases=("subtract",))(torch.sub)
register("mul", inputs=("x", "y"), shape=rules.binary, vjp=_mul_vjp, aliases=("multiply",))(torch.mul)
register("div", inputs=("x", "y"), shape=rules.binary_float, vjp=_div_vjp, aliases=("divide",))(torch.div)
register("pow", inputs=("x", "y"), shape=rules.binary, vjp=_pow_vjp, aliases=("power",))(torch.pow)

register("neg", shape=rules.same, vjp=lambda node, g: (F.neg(g),))(torch.neg)
register("pos", shape=rules.same, vjp=lambda node, g: (g,))(torch.positive)
register("abs", shape=rules.same, vjp=lambda node, g: (F.mul(g, F.sign(node.inputs[0])),))(torch.abs)
register("sign", shape=rules.same)(torch.sign)
register("exp", shape=rules.same_float, vjp=lambda node, g: (F.mul(g, node),))(torch.exp)
register("natlog", shape=rules.same_float, vjp=lambda node, g: (F.div(g, node.inputs[0]),),
         aliases=("log",))(torch.log)
register("square", shape=rules.same, vjp=lambda node, g: (F.mul(g, F.mul(node.inputs[0], 2.0)),))(torch.square)
register("square_root", shape=rules.same_float, vjp=lambda node, g: (F.div(g, F.mul(node, 2.0)),),
         aliases=("sqrt",))(torch.sqrt)


@register("cube", shape=rules.same, vjp=lambda node, g: (F.mul(g, F.mul(F.square(node.inputs[0]), 3.0)),))
def cube(x):
    return x * x * x


@register("cube_root", shape=rules.same_float, vjp=lambda node, g: (F.div(g, F.mul(F.square(node), 3.0)),))
def cube_root(x):
    """Real cube root, negative inputs included (numpy's cbrt)."""
    x = x if x.is_floating_point() else x.to(torch.get_default_dtype())
    return torch.sign(x) * torch.abs(x).pow(1.0 / 3.0)
