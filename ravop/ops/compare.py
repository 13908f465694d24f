"""Comparisons and logic (elementwise, broadcasting, bool results) and `where`, which selects by a mask.

Comparisons and logical ops give bool tensors, which carry no gradient, so they need no VJP. Logical ops
take any dtype and treat nonzero as true, as numpy does.
"""
import torch

from ..core import op_functions as R
from ..core.dtypes import result_dtype
from ..core.registry import get, register
from ..record import api
from ..record.graph import record
from . import rules
from .graph_machinery import unbroadcast

for _name, _kernel in (("greater", torch.gt), ("greater_equal", torch.ge), ("less", torch.lt),
                       ("less_equal", torch.le), ("equal", torch.eq), ("not_equal", torch.ne),
                       ("logical_and", torch.logical_and), ("logical_or", torch.logical_or),
                       ("logical_xor", torch.logical_xor)):
    register(_name, inputs=("x", "y"), shape=rules.compare)(_kernel)
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


def where(*args, condition=None, x=None, y=None):
    """`R.where(condition, x, y)`, numpy's order; the original API's `R.where(x, y, condition=c)` also works."""
    if condition is not None and len(args) == 2 and x is None and y is None:
        x, y = args
    elif len(args) + sum(v is not None for v in (condition, x, y)) == 3:
        named = iter(args)
        condition, x, y = (v if v is not None else next(named) for v in (condition, x, y))
    else:
        raise TypeError("where() takes a condition and two tensors: where(condition, x, y)")
    return record(get("where"), (condition, x, y), api.NO_PARAMS)


api.FRONTENDS["where"] = where
