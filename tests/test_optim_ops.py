"""20 steps of each optimizer op, with gradients from R.grad, equal torch.optim (foreach=False) to 1e-6."""
import pytest
import torch
import torch.nn.functional as TF

import ravop as R
from ravop.interpreter import evaluate

STEPS = 20

CONFIGS = [
    ("adam", {}),
    ("adam", {"lr": 0.01, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.1, "amsgrad": True}),
    ("adam", {"lr": 0.005, "maximize": True, "weight_decay": 0.01}),
    ("adamw", {}),
    ("adamw", {"lr": 0.01, "weight_decay": 0.2, "amsgrad": True, "maximize": True}),
    ("rmsprop", {}),
    ("rmsprop", {"lr": 0.001, "alpha": 0.9, "centered": True}),
    ("rmsprop", {"lr": 0.005, "momentum": 0.9, "weight_decay": 0.05}),
    ("rmsprop", {"lr": 0.002, "momentum": 0.5, "centered": True, "weight_decay": 0.01, "maximize": True,
                 "eps": 1e-4}),
]
TORCH = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop}


def problem():
    g = torch.Generator().manual_seed(7)
    return torch.randn(16, 5, generator=g), torch.randn(16, 3, generator=g), torch.randn(3, 5, generator=g)


def torch_run(name, options):
    x, y, w0 = problem()
    w = torch.nn.Parameter(w0.clone())
    optimizer = TORCH[name]([w], foreach=False, **options)
    for _ in range(STEPS):
        optimizer.zero_grad()
        TF.mse_loss(TF.linear(x, w), y).backward()
        optimizer.step()
    return w.detach()


def ravop_step(name, w, grad, state, step, options):
    """One recorded optimizer step; returns (w', state')."""
    options = dict(options)
    if name == "rmsprop":
        w, *state = R.rmsprop_step(w, grad, *state, **options)
        return w, state
    beta1, beta2 = options.pop("betas", (0.9, 0.999))
    op = R.adam_step if name == "adam" else R.adamw_step
    w, *state = op(w, grad, *state, step=step, beta1=beta1, beta2=beta2, **options)
    return w, state


def ravop_run(name, options):
    R.Graph(name=f"optim-{name}")
    x0, y0, w0 = problem()
    x, y, w = R.t(x0), R.t(y0), R.t(w0)
    zeros = R.t(torch.zeros_like(w0))
    state = [zeros, zeros, zeros]
    for step in range(1, STEPS + 1):
        loss = R.square_loss(y, R.linear(x, w))
        w, state = ravop_step(name, w, R.grad(loss, w), state, step, options)
    return evaluate(w)


@pytest.mark.parametrize("name, options", CONFIGS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CONFIGS)])
def test_steps_match_torch_optim(name, options):
    got, want = ravop_run(name, options), torch_run(name, options)
    assert not torch.equal(want, problem()[2])     # the optimizer moved the weights
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
