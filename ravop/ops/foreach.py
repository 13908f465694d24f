"""`foreach`: apply a registered op to each slice of a tensor along its first axis and stack the results.

The op is named by a string and looked up in the registry (the original ran `eval` on it); it must take
one tensor and give one result. Keyword params are passed through: `R.foreach(x, operation='sum', axis=0)`.
"""
import torch

from ..core import registry
from ..core.registry import REQUIRED, register
from . import rules
from .kernel_vjp import autograd_vjp


def _resolve(operation, params):
    """The per-slice op and its full keyword params; a clear ValueError for anything foreach cannot run."""
    opdef = registry.REGISTRY.get(operation) if isinstance(operation, str) else None
    if opdef is None:
        raise ValueError(f"unknown op {operation!r} to apply to each slice")
    if opdef.random or opdef.variadic or opdef.n_required_inputs != 1 or opdef.internal:
        raise ValueError(f"foreach applies ops of one tensor input, not {opdef.name!r}")
    given = dict(params)
    unknown = set(given) - set(opdef.params)
    if unknown:
        raise ValueError(f"op {opdef.name!r} has no param(s) {', '.join(sorted(unknown))}")
    full = {**opdef.params, **given}
    missing = [k for k, v in full.items() if v is REQUIRED]
    if missing:
        raise ValueError(f"op {opdef.name!r} needs param(s) {', '.join(missing)}")
    return opdef, full


def _shape(x, operation, params=()):
    if not x.shape:
        raise ValueError("foreach needs a tensor of at least 1 dimension")
    opdef, full = _resolve(operation, params)
    one = rules.Like(x.shape[1:], x.dtype)
    out = opdef.shape(one, **full) if opdef.shape is not None else registry.meta_shape(opdef, [one], full)
    if type(out) is list:
        raise ValueError(f"foreach applies ops with one output, not {opdef.name!r}")
    return (x.shape[0],) + tuple(out[0]), out[1]


@register("foreach", params={"operation": REQUIRED, "params": ()}, shape=_shape, vjp=autograd_vjp)
def foreach_kernel(x, operation, params=()):
    """Apply the registered op named `operation` (with `params`) to each x[i] and stack the results."""
    opdef, full = _resolve(operation, params)
    if x.shape[0] == 0:
        shape, dtype = _shape(rules.Like(tuple(x.shape), x.dtype), operation, params)
        return torch.empty(shape, dtype=dtype, device=x.device)
    return torch.stack([opdef.kernel(row, **full) for row in x.unbind(0)])
