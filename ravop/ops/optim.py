"""Optimizer steps as pure ops: (param, grad, state...) -> (param', state'...).

Adam and AdamW give torch.optim's numbers for the same `fused` setting: `fused=False` (the default, as torch's
on a CPU) is its single-tensor update line for line; `fused=True` is torch's `_fused_adam_` kernel, one pass over
each tensor's elements (faster; other rounding). The two differ in the last bits, and a model can amplify that:
a bias followed by batch norm has a gradient that is pure rounding noise (~1e-8, as large as eps), which Adam
scales to steps of `lr`, so the eval output of such a model trained by the two moves apart by ~1e-3 in a few
steps, in eager PyTorch as here. Compare with eager PyTorch's optimizer of the same `fused` setting.
RMSprop is its single-tensor (foreach=False) update, line for line. Each is applied to copies of its inputs: a
value in the graph is never modified in place, so a step can be retried or re-run anywhere.
State a configuration does not use (max_exp_avg_sq without amsgrad, momentum_buffer without momentum,
grad_avg without centered) passes through unchanged, so a step always has the same outputs.
Optimizer steps are not differentiable.
"""
import torch

from ..core.registry import REQUIRED, GroupUpdate, InPlace, register
from .lr_schedule import check_schedule, scheduled_lr


def _step_shapes(param, grad, *state):
    for name, value in (("grad", grad),) + tuple((f"state {i}", s) for i, s in enumerate(state)):
        if value.shape != param.shape:
            raise ValueError(f"{name} has shape {value.shape}, the param has shape {param.shape}")
        if value.dtype != param.dtype:
            raise TypeError(f"{name} has dtype {value.dtype}, the param has dtype {param.dtype}")
    if not param.dtype.is_floating_point:
        raise TypeError(f"param must be floating point, not {param.dtype}")
    return [(param.shape, param.dtype)] + [(s.shape, s.dtype) for s in state]


def _adam_shapes(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step=REQUIRED, lr=0.001, beta1=0.9,
                 beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False, lr_schedule=None,
                 fused=False):
    """torch.optim.Adam's argument checks, at record time, plus a 1-based int step."""
    check_schedule(lr_schedule)
    if type(fused) is not bool:
        raise TypeError(f"fused must be True or False, not {fused!r}")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ValueError(f"step must be a positive int (1 for the first step), not {step!r}")
    if lr < 0 or eps < 0 or weight_decay < 0 or not 0 <= beta1 < 1 or not 0 <= beta2 < 1:
        raise ValueError(f"invalid Adam settings: lr={lr}, eps={eps}, weight_decay={weight_decay}, "
                         f"beta1={beta1}, beta2={beta2}")
    return _step_shapes(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)


def _rmsprop_shapes(param, grad, square_avg, momentum_buffer, grad_avg, lr=0.01, alpha=0.99, eps=1e-8,
                    weight_decay=0.0, momentum=0.0, centered=False, maximize=False, step=1, lr_schedule=None):
    """torch.optim.RMSprop's argument checks, at record time."""
    check_schedule(lr_schedule)
    if type(step) is not int or step < 1:
        raise ValueError(f"step must be a positive int (1 for the first step), not {step!r}")
    if lr < 0 or eps < 0 or weight_decay < 0 or momentum < 0 or alpha < 0:
        raise ValueError(f"invalid RMSprop settings: lr={lr}, alpha={alpha}, eps={eps}, "
                         f"weight_decay={weight_decay}, momentum={momentum}")
    return _step_shapes(param, grad, square_avg, momentum_buffer, grad_avg)


def _counted(step):
    """At run time too: a step recorded 0 in a sync template (ravop.record.loop) counts from 1 once it runs."""
    if step < 1:
        raise ValueError(f"step must be a positive int (1 for the first step), not {step!r}")


def fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
                amsgrad, maximize, decoupled):
    """torch.optim.Adam(fused=True)'s update (AdamW's with `decoupled`) of lists of tensors, in place: params,
    exp_avgs, exp_avg_sqs (and max_exp_avg_sqs with amsgrad) are overwritten; `lr` is this step's.

    One kernel call for every tensor, each updated on its own, so a tensor gets the same bits alone or in a list
    (the step compiler groups a model's updates into one call). The kernel reads raw memory: a tensor that is not
    contiguous is updated on a contiguous copy, copied back (the same elements in the same order, the same bits)."""
    overwritten = (params, exp_avgs, exp_avg_sqs) + ((max_exp_avg_sqs,) if amsgrad else ())
    dense = [[t if t.is_contiguous() else t.contiguous() for t in tensors] for tensors in overwritten]
    grads = [g.contiguous() for g in grads]
    counter = torch.full((), float(step), device=params[0].device)   # read by the kernel, never written
    update = torch._fused_adamw_ if decoupled else torch._fused_adam_
    update(dense[0], grads, dense[1], dense[2], dense[3] if amsgrad else [], [counter] * len(params), lr=lr,
           beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=amsgrad, maximize=maximize)
    for tensors, copies in zip(overwritten, dense):
        for tensor, copy in zip(tensors, copies):
            if copy is not tensor:
                tensor.copy_(copy)


def single_tensor_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, lr, beta1, beta2, eps,
                        weight_decay, amsgrad, maximize, decoupled):
    """torch.optim.adam._single_tensor_adam (torch.optim.Adam's default on a CPU; AdamW's with `decoupled`) of
    lists of tensors, in place, line for line: the same tensors overwritten as `fused_adam_`'s. Several CPU tensors
    are updated by `torch._foreach_*` ops, whose CPU kernels loop over the tensors in C++ with the per-tensor
    kernels below (the same bits: tested), saving the Python of six calls per tensor (a third of a small model's
    update)."""
    step = float(step)   # torch keeps `step` in a float tensor and reads it back with .item()
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2 ** 0.5
    if len(params) > 1 and all(p.device.type == "cpu" for p in params):
        _foreach_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, lr, beta1, beta2, eps, weight_decay,
                       amsgrad, maximize, decoupled, step_size, bias_correction2_sqrt)
        return
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        exp_avg, exp_avg_sq = exp_avgs[i], exp_avg_sqs[i]
        if weight_decay != 0:
            if decoupled:
                param.mul_(1 - lr * weight_decay)
            else:
                grad = grad.add(param, alpha=weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        if amsgrad:
            torch.maximum(max_exp_avg_sqs[i], exp_avg_sq, out=max_exp_avg_sqs[i])
            denom = (max_exp_avg_sqs[i].sqrt() / bias_correction2_sqrt).add_(eps)
        else:
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)


def _foreach_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, lr, beta1, beta2, eps, weight_decay,
                   amsgrad, maximize, decoupled, step_size, bias_correction2_sqrt):
    """The loop of `single_tensor_adam_` as one `torch._foreach_*` call per line (CPU tensors)."""
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        if decoupled:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        else:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    if amsgrad:
        torch._foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs)
        denoms = torch._foreach_sqrt(max_exp_avg_sqs)
    else:
        denoms = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denoms, bias_correction2_sqrt)
    torch._foreach_add_(denoms, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denoms, value=-step_size)


def adam_update_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
                 amsgrad, maximize, decoupled, fused):
    """Adam's update of lists of tensors in place, by torch's fused kernel or its single-tensor loop."""
    update = fused_adam_ if fused else single_tensor_adam_
    update(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
           amsgrad, maximize, decoupled)

def _adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, amsgrad,
          maximize, decoupled, fused, in_place=False, lr_schedule=None):
    """torch.optim.Adam's step for one tensor (decoupled=True is AdamW's, `fused` as torch's); `in_place` updates
    param, exp_avg and exp_avg_sq themselves instead of copies (the op's `in_place`); `lr_schedule` sets this
    step's learning rate from `lr` (ravop.ops.lr_schedule)."""
    _counted(step)
    lr = scheduled_lr(lr, lr_schedule, step)
    if not in_place:
        param, exp_avg, exp_avg_sq = param.clone(), exp_avg.clone(), exp_avg_sq.clone()
    if amsgrad:
        max_exp_avg_sq = max_exp_avg_sq.clone()   # not among the values the in-place variant may overwrite
    adam_update_([param], [grad], [exp_avg], [exp_avg_sq], [max_exp_avg_sq], step, lr, beta1, beta2, eps,
                 weight_decay, amsgrad, maximize, decoupled, fused)
    return param, exp_avg, exp_avg_sq, max_exp_avg_sq


def _adam_in_place(decoupled):
    def kernel(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8,
               weight_decay=0.0, amsgrad=False, maximize=False, lr_schedule=None, fused=False):
        return _adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay,
                     amsgrad, maximize, decoupled, fused, in_place=True, lr_schedule=lr_schedule)
    return kernel


def _adam_group(decoupled):
    """Adam's (AdamW's with `decoupled`) update of many params in place, for the step compiler's group of a loop's
    in-place steps: the op's own update (`fused`: torch's fused kernel, one call with every tensor; else torch's
    single-tensor loop), each tensor updated on its own either way."""
    def update(args, step, lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False,
               maximize=False, lr_schedule=None, fused=False):
        params, grads, exp_avgs, exp_avg_sqs, maxes = (list(args[k::5]) for k in range(5))
        adam_update_(params, grads, exp_avgs, exp_avg_sqs, maxes, step, scheduled_lr(lr, lr_schedule, step), beta1,
                     beta2, eps, weight_decay, amsgrad, maximize, decoupled, fused)
        return list(zip(params, exp_avgs, exp_avg_sqs, maxes))
    return update


def _adam_covers(params):
    return not params["amsgrad"]   # amsgrad's max_exp_avg_sq is updated on a copy, not among the overwritten


# The in-place updates are for a training loop that owns the values it steps (ravop.runtime.loop_run: they are its
# carried values, read by nothing after the step): param, exp_avg and exp_avg_sq. The copies are a fifth of a
# small model's step.
ADAM_OVERWRITES = (0, 2, 3)
ADAM_INPUTS = ("param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
ADAM_PARAMS = {"step": REQUIRED, "lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0,
               "amsgrad": False, "maximize": False, "lr_schedule": None, "fused": False}


@register("adam_step", inputs=ADAM_INPUTS, params=ADAM_PARAMS, shape=_adam_shapes, method=False, counter="step",
          in_place=InPlace(_adam_in_place(False), ADAM_OVERWRITES),
          group_update=GroupUpdate(_adam_group(False), "optimizer_groups", in_place=True, covers=_adam_covers))
def adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8,
              weight_decay=0.0, amsgrad=False, maximize=False, lr_schedule=None, fused=False):
    """One torch.optim.Adam step (`step` counts from 1) -> (param', exp_avg', exp_avg_sq', max_exp_avg_sq');
    `lr_schedule`: the step's learning rate from `lr` and `step`, as a torch.optim.lr_scheduler stepped after
    every optimizer step (ravop.ops.lr_schedule); `fused`: torch's fused kernel (torch.optim.Adam(fused=True))."""
    return _adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay,
                 amsgrad, maximize, False, fused, lr_schedule=lr_schedule)


@register("adamw_step", inputs=ADAM_INPUTS, params={**ADAM_PARAMS, "weight_decay": 0.01}, shape=_adam_shapes,
          method=False, counter="step", in_place=InPlace(_adam_in_place(True), ADAM_OVERWRITES),
          group_update=GroupUpdate(_adam_group(True), "optimizer_groups", in_place=True, covers=_adam_covers))
def adamw_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8,
               weight_decay=0.01, amsgrad=False, maximize=False, lr_schedule=None, fused=False):
    """One torch.optim.AdamW step (decoupled weight decay) -> (param', exp_avg', exp_avg_sq', max_exp_avg_sq');
    `lr_schedule` and `fused` as adam_step's."""
    return _adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay,
                 amsgrad, maximize, True, fused, lr_schedule=lr_schedule)


def _foreach_rmsprop(args, step=1, lr=0.01, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False,
                     maximize=False, lr_schedule=None):
    """rmsprop_step (on copies, as the op) for many params, `args` every one's five inputs in turn:
    `torch._foreach_*`, whose kernels loop over the tensors in C++ with the same per-tensor kernels as the op's,
    in the same order."""
    params, grads, square_avgs, momentum_buffers, grad_avgs = (list(args[k::5]) for k in range(5))
    lr = scheduled_lr(lr, lr_schedule, step)
    params, square_avgs = [p.clone() for p in params], [s.clone() for s in square_avgs]
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_mul_(square_avgs, alpha)
    torch._foreach_addcmul_(square_avgs, grads, grads, 1 - alpha)
    if centered:
        grad_avgs = [g.clone() for g in grad_avgs]
        torch._foreach_lerp_(grad_avgs, grads, 1 - alpha)
        avg = torch._foreach_addcmul(square_avgs, grad_avgs, grad_avgs, -1)
        torch._foreach_sqrt_(avg)
    else:
        avg = torch._foreach_sqrt(square_avgs)
    torch._foreach_add_(avg, eps)
    if momentum > 0:
        momentum_buffers = [b.clone() for b in momentum_buffers]
        torch._foreach_mul_(momentum_buffers, momentum)
        torch._foreach_addcdiv_(momentum_buffers, grads, avg)
        torch._foreach_add_(params, momentum_buffers, alpha=-lr)
    else:
        torch._foreach_addcdiv_(params, grads, avg, -lr)
    return list(zip(params, square_avgs, momentum_buffers, grad_avgs))


@register("rmsprop_step", inputs=("param", "grad", "square_avg", "momentum_buffer", "grad_avg"),
          params={"lr": 0.01, "alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.0, "centered": False,
                  "maximize": False, "step": 1, "lr_schedule": None}, shape=_rmsprop_shapes, method=False,
          counter="step", group_update=GroupUpdate(_foreach_rmsprop, "optimizer_groups"))
def rmsprop_step(param, grad, square_avg, momentum_buffer, grad_avg, lr=0.01, alpha=0.99, eps=1e-8,
                 weight_decay=0.0, momentum=0.0, centered=False, maximize=False, step=1, lr_schedule=None):
    """One torch.optim.RMSprop step -> (param', square_avg', momentum_buffer', grad_avg'); `step` (from 1)
    counts steps for `lr_schedule` only, as adam_step's."""
    _counted(step)
    lr = scheduled_lr(lr, lr_schedule, step)
    param, square_avg = param.clone(), square_avg.clone()
    grad = grad if not maximize else -grad
    if weight_decay != 0:
        grad = grad.add(param, alpha=weight_decay)
    square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    if centered:
        grad_avg = grad_avg.clone()
        grad_avg.lerp_(grad, 1 - alpha)
        avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
    else:
        avg = square_avg.sqrt()
    avg = avg.add_(eps)
    if momentum > 0:
        momentum_buffer = momentum_buffer.clone()
        momentum_buffer.mul_(momentum).addcdiv_(grad, avg)
        param.add_(momentum_buffer, alpha=-lr)
    else:
        param.addcdiv_(grad, avg, value=-lr)
    return param, square_avg, momentum_buffer, grad_avg
