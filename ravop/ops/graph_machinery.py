"""Ops the graph machinery itself needs: constants, picking one output of a multi-output op, and
reducing a broadcast gradient back to an input's shape."""
import torch

from ..core import op_functions as R
from ..core.registry import HOLE, INPUT, LOOP, LOOP_INDEX, LOOP_STOP, PICKS, PROJECTION, REQUIRED, register
from .rules import broadcast


def _const_kernel():
    raise RuntimeError("const ops are inputs: their values come from the tensor store, not a kernel")


register("const", inputs=(), method=False, shape=lambda: ((), torch.float32), kind=INPUT)(_const_kernel)


def _loop_kernel(*values, **params):
    raise RuntimeError("a loop runs as a subgraph of its own (ravop.runtime.loop_run), not as a kernel")


def _loop_hole_kernel(**params):
    raise RuntimeError("a loop hole is filled by the loop running its step, not computed")


# A training loop (ravop.record.loop): its inputs are the carried values' initial values and what its steps read;
# its outputs the carried values after the last step. Not deterministic as far as the passes go: it is never
# folded into a constant or merged with another loop. Its step templates read `loop_hole` nodes.
register("loop", inputs=("*values",), params={LOOP_INDEX: REQUIRED}, method=False, deterministic=False,
         shape=lambda *values, loop: ((), torch.float32), kind=LOOP)(_loop_kernel)
register("loop_hole", inputs=(), params={"hole": REQUIRED}, method=False, deterministic=False,
         shape=lambda hole: ((), torch.float32), kind=HOLE)(_loop_hole_kernel)


# A loop step's decision to end its loop (ravop.record.loop.Step.stop_if): true ends it at its next boundary
# (ravop.runtime.loop_run); `reason` says why, in the graph's record. Never folded or merged: it is a decision.
@register("loop_stop", inputs=("flag",), params={"reason": REQUIRED}, method=False, deterministic=False,
          shape=lambda flag, reason: ((), torch.bool), kind=LOOP_STOP)
def _loop_stop_kernel(flag, reason):
    return flag.reshape(()).to(torch.bool)


def _tuple_get_shape(x, index):
    return x.shape[index], x.dtype[index]


def _tuple_get_vjp(node, g, wants):
    return (None,)  # handled by autodiff: gradients of a multi-output node are gathered per output


@register("tuple_get", params={PICKS: REQUIRED}, method=False, shape=_tuple_get_shape, vjp=_tuple_get_vjp,
          kind=PROJECTION)
def tuple_get(x, index):
    return x[index]


def _sum_to_shape(x, shape):
    broadcast(tuple(shape), x.shape)  # the target must broadcast to the input's shape
    return tuple(shape), x.dtype


def _sum_to_vjp(node, g, wants):
    return (R.broadcast_to(g, shape=node.inputs[0].shape),)


@register("sum_to", params={"shape": REQUIRED}, method=False, shape=_sum_to_shape, vjp=_sum_to_vjp)
def sum_to(x, shape):
    """Sum `x` over the dimensions that broadcasting added or stretched, giving `shape`."""
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    lead = x.dim() - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    return x.sum(dim=dims, keepdim=True).reshape(shape) if dims else x.reshape(shape)


def _broadcast_to_shape(x, shape):
    if broadcast(x.shape, tuple(shape)) != tuple(shape):
        raise ValueError(f"cannot broadcast {x.shape} to {tuple(shape)}")
    return tuple(shape), x.dtype


def _broadcast_to_vjp(node, g, wants):
    return (R.sum_to(g, shape=node.inputs[0].shape),)


@register("broadcast_to", params={"shape": REQUIRED}, shape=_broadcast_to_shape, vjp=_broadcast_to_vjp)
def broadcast_to(x, shape):
    return x.expand(tuple(shape)).contiguous()


def unbroadcast(grad, like):
    """A gradient of broadcast shape, summed back to the shape of input `like` (no op when equal)."""
    if grad is None or grad.shape == like.shape:
        return grad
    return R.sum_to(grad, shape=like.shape)
