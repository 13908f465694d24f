"""Comparisons and logic (elementwise, broadcasting, bool results) and `where`, which selects by a mask.

Comparisons and logical ops give bool tensors, which carry no gradient, so they need no VJP. Logical ops
take any dtype and treat nonzero as true, as numpy does.
"""
import torch

from ..core import op_functions as R
from ..core.dtypes import result_dtype
from ..core.registry import register
from . import rules
from .graph_machinery import unbroadcast

for _name, _kernel, _operators in (("greater", torch.gt, ("__gt__",)), ("greater_equal", torch.ge, ("__ge__",)),
                                   ("less", torch.lt, ("__lt__",)), ("less_equal", torch.le, ("__le__",)),
                                   ("equal", torch.eq, ("__eq__",)), ("not_equal", torch.ne, ("__ne__",)),
                                   ("logical_and", torch.logical_and, ()), ("logical_or", torch.logical_or, ()),
                                   ("logical_xor", torch.logical_xor, ())):
    register(_name, inputs=("x", "y"), shape=rules.compare, operators=_operators)(_kernel)
register("logical_not", shape=rules.same_bool)(torch.logical_not)


def _where_shape(condition, x, y):
    shape = rules.broadcast_all(condition.shape, x.shape, y.shape)
    return shape, result_dtype(x.dtype, len(x.shape), y.dtype, len(y.shape))


def _where_vjp(node, g, wants):
    condition, x, y = node.inputs
    return None, unbroadcast(R.where(condition, g, 0.0), x), unbroadcast(R.where(condition, 0.0, g), y)


@register("where", inputs=("condition", "x", "y"), shape=_where_shape, vjp=_where_vjp)
def where_kernel(condition, x, y):
    """Elementwise `x` where `condition` is true (nonzero), else `y`, all three broadcast (numpy.where);
    the result has the promoted dtype of x and y."""
    dtype = torch.result_type(x, y)
    return torch.where(condition.to(torch.bool), x.to(dtype), y.to(dtype))
