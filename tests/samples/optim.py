"""Samples for the optimizer steps (ravop/ops/optim.py): one step from a given state, against torch.optim
resumed from the same state (Adam and AdamW with the sample's `fused`, as ravop's kernels; RMSprop foreach=False)."""
import torch

from . import Sample
from .nn import rand, randn


def torch_step(optimizer_class, param, grad, state, **options):
    """Run one torch.optim step on a copy of `param` whose optimizer state is `state`; return the param."""
    p = torch.nn.Parameter(param.clone())
    implementation = {"foreach": False} if optimizer_class is torch.optim.RMSprop else {}
    optimizer = optimizer_class([p], **implementation, **options)
    optimizer.state[p] = {k: v.clone() for k, v in state.items()}
    p.grad = grad.clone()
    optimizer.step()
    return p.detach(), optimizer.state[p]


def _adam_ref(optimizer_class):
    def reference(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr=0.001, beta1=0.9, beta2=0.999,
                  eps=1e-8, weight_decay=0.0 if optimizer_class is torch.optim.Adam else 0.01, amsgrad=False,
                  maximize=False, fused=False):
        state = {"step": torch.tensor(float(step - 1)), "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        if amsgrad:
            state["max_exp_avg_sq"] = max_exp_avg_sq
        p, s = torch_step(optimizer_class, param, grad, state, lr=lr, betas=(beta1, beta2), eps=eps,
                          weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize, fused=fused)
        return p, s["exp_avg"], s["exp_avg_sq"], s["max_exp_avg_sq"] if amsgrad else max_exp_avg_sq
    return reference


def _rmsprop_ref(param, grad, square_avg, momentum_buffer, grad_avg, lr=0.01, alpha=0.99, eps=1e-8,
                 weight_decay=0.0, momentum=0.0, centered=False, maximize=False):
    state = {"step": torch.tensor(0.0), "square_avg": square_avg}
    if momentum > 0:
        state["momentum_buffer"] = momentum_buffer
    if centered:
        state["grad_avg"] = grad_avg
    p, s = torch_step(torch.optim.RMSprop, param, grad, state, lr=lr, alpha=alpha, eps=eps,
                      weight_decay=weight_decay, momentum=momentum, centered=centered, maximize=maximize)
    return (p, s["square_avg"], s["momentum_buffer"] if momentum > 0 else momentum_buffer,
            s["grad_avg"] if centered else grad_avg)


def _state(*shape):
    """param, grad, a signed moment and two positive ones (second moments must be non-negative)."""
    return randn(*shape), randn(*shape), randn(*shape) * 0.1, rand(*shape) * 0.01, rand(*shape) * 0.02


def _adam_samples(optimizer_class):
    ref = _adam_ref(optimizer_class)
    return [
        Sample(_state(3, 4), {"step": 1}, reference=ref, note="first step"),
        Sample(_state(5), {"step": 7, "lr": 0.01, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6}, reference=ref),
        Sample(_state(2, 3), {"step": 3, "weight_decay": 0.1, "amsgrad": True}, reference=ref, note="amsgrad"),
        Sample(_state(2, 3), {"step": 2, "maximize": True, "weight_decay": 0.05}, reference=ref, note="maximize"),
        Sample(_state(3, 4), {"step": 1, "fused": True}, reference=ref, note="fused, first step"),
        Sample(_state(2, 3), {"step": 4, "weight_decay": 0.1, "amsgrad": True, "maximize": True, "fused": True},
               reference=ref, note="fused, every option"),
        Sample(_state(0, 3), {"step": 1}, reference=ref, note="empty"),
    ]


def _rmsprop_state(*shape):
    param, grad, grad_avg, square_avg, _ = _state(*shape)
    return param, grad, square_avg + 0.05, randn(*shape) * 0.1, grad_avg * 0.1


SAMPLES = {
    "adam_step": _adam_samples(torch.optim.Adam),
    "adamw_step": _adam_samples(torch.optim.AdamW),
    "rmsprop_step": [
        Sample(_rmsprop_state(3, 4), reference=_rmsprop_ref, note="defaults"),
        Sample(_rmsprop_state(3, 4), {"momentum": 0.9, "weight_decay": 0.01}, reference=_rmsprop_ref),
        Sample(_rmsprop_state(5), {"centered": True, "alpha": 0.9, "lr": 0.001}, reference=_rmsprop_ref),
        Sample(_rmsprop_state(5), {"centered": True, "momentum": 0.5, "maximize": True, "eps": 1e-4},
               reference=_rmsprop_ref, note="every option"),
    ],
}
