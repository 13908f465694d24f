"""VJPs computed by torch.autograd through the op's own kernel, for ops whose backward is awkward to record
as primitive ops (products with zeros, order statistics, `foreach` over any op).

The backward is still one recorded op, `kernel_vjp`, so it runs on any worker like every other op; its
kernel looks the forward op up by name in the registry (never `eval`) and differentiates that kernel, so
the gradient is exactly torch's for the same kernel. It has no VJP itself: these ops support first-order
gradients only.
"""
import torch

from ..core import op_functions as R
from ..core import registry
from ..core.registry import REQUIRED, register


def autograd_vjp(node, g, wants):
    """VJP rule: the gradient w.r.t. the node's first input; its other inputs get none."""
    grad = R.kernel_vjp([*node.inputs, g], op=node.op, params=node.params or {})
    return (grad,) + (None,) * (len(node.inputs) - 1)


def _shape(*xs, op, params):
    opdef = registry.get(op)
    if opdef.vjp is not autograd_vjp:
        raise ValueError(f"kernel_vjp differentiates only ops whose VJP is autograd_vjp, not {op!r}")
    return xs[0].shape, xs[0].dtype


@register("kernel_vjp", inputs=("*xs",), params={"op": REQUIRED, "params": ()}, shape=_shape, method=False)
def kernel_vjp(*xs, op, params):
    """xs = (forward inputs..., output gradient): d(op's kernel)/d(first input), by torch.autograd."""
    opdef = registry.get(op)
    if opdef.vjp is not autograd_vjp:
        raise ValueError(f"kernel_vjp differentiates only ops whose VJP is autograd_vjp, not {op!r}")
    *inputs, g = xs
    x = inputs[0].detach().requires_grad_()
    with torch.enable_grad():
        out = opdef.kernel(x, *inputs[1:], **dict(params))
        if not out.requires_grad:  # e.g. a reduction over an empty tensor: nothing flows back
            return torch.zeros_like(x)
        (grad,) = torch.autograd.grad(out, x, g.to(out.dtype), allow_unused=True)
    return torch.zeros_like(x) if grad is None else grad
