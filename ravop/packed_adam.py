"""Adam over a model's tensors packed in flat buffers: one elementwise kernel per update stage for all of them.

The step compiler's foreach update (ravop/step_compiler.py) runs, on a CPU, one small kernel per tensor and
stage: 7 stages over a CNN's 12 parameters are 84 kernel calls a step, each a few microseconds of set-up around a
few hundred elements. When the parameters, first and second moments each lie end to end in one buffer, the same
stages run as 7 kernels over the buffers (the gradients are concatenated: one copy).

Adam's stages are elementwise, so each element gets the same arithmetic wherever it lies; the one way its bits
could change is a kernel whose vectorised body and scalar tail round differently (an element at a tensor's end
runs in the tail, in a buffer it may not). `bitwise_safe()` checks that on this machine once, against the op's
own per-tensor kernel over sizes that put elements in both, and packing is used only where they agree.

The first update of a loop copies the tensors into new buffers and hands back views of them; the loop carries the
views on, so every later update finds them packed (`packed`) and runs on the buffers directly.
"""
from __future__ import annotations

import functools
import operator
from typing import Optional, Sequence

import torch
from torch._utils import _flatten_dense_tensors

from .ops import optim

PACKED_DTYPES = (torch.float32,)   # the dtypes `bitwise_safe` checks
MAX_PACKED_BYTES = 64 * 2**20      # packing copies the gradients into one tensor at every update: a model of
#                                    larger tensors gains nothing from it (its kernels outweigh their set-up) and
#                                    would pay that memory, so its groups update per tensor


def packed(tensors: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """The flat buffer `tensors` are consecutive contiguous views of (same dtype, CPU, one storage, in order),
    or None."""
    first = tensors[0]
    dtype, storage = first.dtype, first.untyped_storage().data_ptr()
    end = first.data_ptr()
    total = 0
    for t in tensors:
        if t.dtype != dtype or t.data_ptr() != end or not t.is_contiguous() or t.device.type != "cpu" or \
                t.untyped_storage().data_ptr() != storage:
            return None
        n = t.numel()
        end += n * t.element_size()
        total += n
    return first.as_strided((total,), (1,))


def pack(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(a new flat buffer holding copies of `tensors`, end to end, views of it shaped as each)."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    views, at = [], 0
    for t in tensors:
        n = t.numel()
        views.append(flat[at:at + n].view(t.shape))
        at += n
    return flat, views


class PackedState:
    """One optimizer group's packed tensors: the views it last handed out (an update given them again, as the
    loop carries them on, needs no layout check), their buffers, and the scratch buffers of an update."""
    __slots__ = ("views", "flats", "denom")

    def __init__(self) -> None:
        self.views: list[list[torch.Tensor]] = []
        self.flats: list[torch.Tensor] = []
        self.denom = torch.empty(0)

    def kept(self, groups: Sequence[list[torch.Tensor]]) -> bool:
        """Whether `groups` are the views handed out last."""
        return len(groups) == len(self.views) and all(
            len(given) == len(views) and all(map(operator.is_, given, views))
            for given, views in zip(groups, self.views))

    def buffers(self, groups: Sequence[list[torch.Tensor]]) -> Optional[tuple[list[torch.Tensor],
                                                                           list[list[torch.Tensor]]]]:
        """(flat buffers, views) for `groups` (lists of tensors the update overwrites: params, exp_avgs,
        exp_avg_sqs): the ones given if they are packed already, else new copies; None where they may not be
        updated packed (`packable`)."""
        if self.kept(groups):
            return self.flats, self.views
        if not packable([t for tensors in groups for t in tensors]):
            return None
        flats, views = [], []
        for tensors in groups:
            flat = packed(tensors)
            if flat is None:
                flat, tensors = pack(tensors)
            flats.append(flat)
            views.append(list(tensors))
        self.flats, self.views = flats, views
        self.denom = torch.empty_like(flats[0])
        return flats, views

    def flat_grad(self, grads: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
        """`grads` end to end in one tensor (torch's C++ flattening, as DDP's buckets: half the time of a Python
        list of reshapes and a cat), or None if they do not match the parameters' buffer in size and dtype."""
        grad = _flatten_dense_tensors(grads)
        param = self.flats[0]
        return grad if grad.dtype == param.dtype and grad.numel() == param.numel() else None


def packable(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether a group of tensors (params, exp_avgs, exp_avg_sqs) may be updated packed: CPU tensors of one
    checked dtype, params of at most MAX_PACKED_BYTES, on a machine whose kernels give packed and per-tensor
    updates the same bits."""
    dtype = tensors[0].dtype
    return dtype in PACKED_DTYPES and all(t.dtype == dtype and t.device.type == "cpu" for t in tensors) and \
        sum(t.nbytes for t in tensors) <= 3 * MAX_PACKED_BYTES and bitwise_safe()


def adam(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
         denom: torch.Tensor, step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
         maximize: bool, decoupled: bool) -> None:
    """ravop.ops.optim._adam in place (amsgrad off, `lr` already scheduled) on flat buffers: the stages of the
    foreach update, in its order; `denom` a scratch buffer of their size."""
    grad = optim.weight_decayed(param, grad.neg() if maximize else grad, lr, weight_decay, decoupled)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2)
    exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
    step_f = float(step)
    bias_correction1 = 1 - beta1 ** step_f
    bias_correction2 = 1 - beta2 ** step_f
    step_size = lr / bias_correction1
    torch.sqrt(exp_avg_sq, out=denom)
    denom.div_(bias_correction2 ** 0.5)
    denom.add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


@functools.lru_cache(maxsize=None)
def bitwise_safe() -> bool:
    """Whether, on this machine, the packed update gives the bits of the op's kernel run tensor by tensor
    (float32; every option's stages; sizes that put elements in kernels' vectorised bodies and scalar tails both
    ways)."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(n,) for n in (1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100)] + [(5, 7), (16, 1, 3, 3)]

    def draw(scale: float = 1.0) -> list[torch.Tensor]:
        return [torch.randn(s, generator=generator) * scale for s in shapes]

    for decoupled, weight_decay, maximize in ((False, 0.0, False), (False, 0.1, True), (True, 0.05, False)):
        params, exp_avgs, exp_avg_sqs = draw(), draw(0.1), [t.abs() for t in draw(0.01)]
        flats = [pack(ts)[0] for ts in (params, exp_avgs, exp_avg_sqs)]
        denom = torch.empty_like(flats[0])
        for step in (1, 2, 3):
            grads = draw(10.0 ** (step - 2))
            settings = (step, 0.01, 0.9, 0.999, 1e-8, weight_decay, maximize)
            for tensors in zip(params, grads, exp_avgs, exp_avg_sqs):
                optim._adam(*tensors, None, step, 0.01, 0.9, 0.999, 1e-8, weight_decay, False, maximize, decoupled,
                            in_place=True)
            adam(flats[0], pack(grads)[0], flats[1], flats[2], denom, *settings, decoupled)
        for flat, tensors in zip(flats, (params, exp_avgs, exp_avg_sqs)):
            if not torch.equal(flat.view(torch.int32), pack(tensors)[0].view(torch.int32)):
                return False
    return True
