"""Optimizer steps as pure ops: (param, grad, state...) -> (param', state'...).

Each kernel is torch.optim's single-tensor (foreach=False) update, line for line, applied to copies of its
inputs: a value in the graph is never modified in place, so a step can be retried or re-run anywhere.
State a configuration does not use (max_exp_avg_sq without amsgrad, momentum_buffer without momentum,
grad_avg without centered) passes through unchanged, so a step always has the same outputs.
Optimizer steps are not differentiable.
"""
import torch

from ..registry import REQUIRED, InPlace, register
from .lr_schedule import check_schedule, scheduled_lr


def _step_shapes(param, grad, *state):
    for name, value in (("grad", grad),) + tuple((f"state {i}", s) for i, s in enumerate(state)):
        if value.shape != param.shape:
            raise ValueError(f"{name} has shape {value.shape}, the param has shape {param.shape}")
    if not param.dtype.is_floating_point:
        raise TypeError(f"param must be floating point, not {param.dtype}")
    return [(param.shape, param.dtype)] + [(s.shape, s.dtype) for s in state]


def _adam_shapes(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step=REQUIRED, lr=0.001, beta1=0.9,
                 beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False, lr_schedule=None):
    """torch.optim.Adam's argument checks, at record time, plus a 1-based int step."""
    check_schedule(lr_schedule)
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
    """At run time too: a step recorded 0 in a sync template (ravop.loop) counts from 1 once it runs."""
    if step < 1:
        raise ValueError(f"step must be a positive int (1 for the first step), not {step!r}")


def weight_decayed(param, grad, lr, weight_decay, decoupled):
    """Adam's weight decay: AdamW's (`decoupled`) shrinks `param` in place; Adam's is added to the gradient.
    Returns the gradient the moments then take."""
    if weight_decay != 0:
        if decoupled:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    return grad


def _adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, amsgrad,
          maximize, decoupled, in_place=False, lr_schedule=None):
    """torch.optim.adam._single_tensor_adam for one tensor (decoupled=True is AdamW); `in_place` updates
    param, exp_avg and exp_avg_sq themselves instead of copies (the op's `in_place`); `lr_schedule` sets this
    step's learning rate from `lr` (ravop.ops.lr_schedule)."""
    _counted(step)
    lr = scheduled_lr(lr, lr_schedule, step)
    if not in_place:
        param, exp_avg, exp_avg_sq = param.clone(), exp_avg.clone(), exp_avg_sq.clone()
    grad = weight_decayed(param, grad if not maximize else -grad, lr, weight_decay, decoupled)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step = float(step)  # torch keeps `step` in a float tensor and reads it back with .item()
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2 ** 0.5
    if amsgrad:
        max_exp_avg_sq = torch.maximum(max_exp_avg_sq, exp_avg_sq)
        denom = (max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    else:
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)
    return param, exp_avg, exp_avg_sq, max_exp_avg_sq


def _adam_in_place(decoupled):
    def kernel(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8,
               weight_decay=0.0, amsgrad=False, maximize=False, lr_schedule=None):
        return _adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay,
                     amsgrad, maximize, decoupled, in_place=True, lr_schedule=lr_schedule)
    return kernel


# The in-place updates are for a training loop that owns the values it steps (ravop.loop_run: they are its carried
# values, read by nothing after the step): param, exp_avg and exp_avg_sq. The copies are a fifth of a small
# model's step.
ADAM_OVERWRITES = (0, 2, 3)
ADAM_INPUTS = ("param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
ADAM_PARAMS = {"step": REQUIRED, "lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0,
               "amsgrad": False, "maximize": False, "lr_schedule": None}


@register("adam_step", inputs=ADAM_INPUTS, params=ADAM_PARAMS, shape=_adam_shapes, method=False, counter="step",
          in_place=InPlace(_adam_in_place(False), ADAM_OVERWRITES))
def adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8,
              weight_decay=0.0, amsgrad=False, maximize=False, lr_schedule=None):
    """One torch.optim.Adam step (`step` counts from 1) -> (param', exp_avg', exp_avg_sq', max_exp_avg_sq');
    `lr_schedule`: the step's learning rate from `lr` and `step`, as a torch.optim.lr_scheduler stepped after
    every optimizer step (ravop.ops.lr_schedule)."""
    return _adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay,
                 amsgrad, maximize, decoupled=False, lr_schedule=lr_schedule)


@register("adamw_step", inputs=ADAM_INPUTS, params={**ADAM_PARAMS, "weight_decay": 0.01}, shape=_adam_shapes,
          method=False, counter="step", in_place=InPlace(_adam_in_place(True), ADAM_OVERWRITES))
def adamw_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8,
               weight_decay=0.01, amsgrad=False, maximize=False, lr_schedule=None):
    """One torch.optim.AdamW step (decoupled weight decay) -> (param', exp_avg', exp_avg_sq', max_exp_avg_sq');
    `lr_schedule` as adam_step's."""
    return _adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay,
                 amsgrad, maximize, decoupled=True, lr_schedule=lr_schedule)


@register("rmsprop_step", inputs=("param", "grad", "square_avg", "momentum_buffer", "grad_avg"),
          params={"lr": 0.01, "alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.0, "centered": False,
                  "maximize": False, "step": 1, "lr_schedule": None}, shape=_rmsprop_shapes, method=False,
          counter="step")
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
