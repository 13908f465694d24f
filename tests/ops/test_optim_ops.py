"""20 steps of each optimizer op, with gradients from R.grad, equal torch.optim bit for bit: Adam and AdamW of the
same `fused` setting (torch's default single-tensor loop, or its fused kernel), RMSprop as `foreach=False` (its
single-tensor loop)."""
import pytest
import torch
import torch.nn.functional as TF

import ravop as R
from ravop.core import registry
from ravop.ops import optim
from ravop.runtime.evaluate import evaluate

STEPS = 20

CONFIGS = [
    ("adam", {}),
    ("adam", {"lr": 0.01, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.1, "amsgrad": True}),
    ("adam", {"lr": 0.005, "maximize": True, "weight_decay": 0.01}),
    ("adam", {"fused": True}),
    ("adam", {"lr": 0.01, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.1, "amsgrad": True, "fused": True}),
    ("adamw", {}),
    ("adamw", {"lr": 0.01, "weight_decay": 0.2, "amsgrad": True, "maximize": True}),
    ("adamw", {"lr": 0.01, "weight_decay": 0.2, "amsgrad": True, "maximize": True, "fused": True}),
    ("rmsprop", {}),
    ("rmsprop", {"lr": 0.001, "alpha": 0.9, "centered": True}),
    ("rmsprop", {"lr": 0.005, "momentum": 0.9, "weight_decay": 0.05}),
    ("rmsprop", {"lr": 0.002, "momentum": 0.5, "centered": True, "weight_decay": 0.01, "maximize": True,
                 "eps": 1e-4}),
]
TORCH = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop}
IMPLEMENTATION = {"adam": {}, "adamw": {}, "rmsprop": {"foreach": False}}


def problem():
    g = torch.Generator().manual_seed(7)
    return torch.randn(16, 5, generator=g), torch.randn(16, 3, generator=g), torch.randn(3, 5, generator=g)


def torch_run(name, options):
    x, y, w0 = problem()
    w = torch.nn.Parameter(w0.clone())
    optimizer = TORCH[name]([w], **IMPLEMENTATION[name], **options)
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
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_adam_on_tensors_in_any_layout_gives_the_bits_of_contiguous_ones(in_place, fused):
    """torch's fused kernel reads raw memory: transposed params, moments and gradients are updated as their
    contiguous copies would be, and (in place) written back into the tensors given."""
    g = torch.Generator().manual_seed(3)
    contiguous = [torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g),
                  torch.rand(5, 7, generator=g), torch.rand(5, 7, generator=g)]
    transposed = [t.t().contiguous().t() for t in contiguous]
    assert not any(t.is_contiguous() for t in transposed)
    opdef = registry.REGISTRY["adam_step"]
    kernel = opdef.in_place.kernel if in_place else opdef.kernel
    settings = {"step": 3, "lr": 0.01, "weight_decay": 0.1, "amsgrad": True, "fused": fused}
    want = kernel(*[t.clone() for t in contiguous], **settings)
    given = [t.clone() for t in transposed]
    got = kernel(*given, **settings)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    if in_place:
        assert all(got[k] is given[i] for k, i in enumerate((0, 2, 3)))   # param, exp_avg, exp_avg_sq


def test_a_step_with_state_of_another_dtype_is_refused_when_recorded():
    R.Graph(name="optim-dtypes")
    w = R.t(torch.ones(3))
    with pytest.raises(R.ShapeError, match="adam_step: state 1 has dtype torch.float64, the param has dtype torch.float32.* at .*test_optim_ops.py"):
        R.adam_step(w, w, R.t(torch.zeros(3)), R.t(torch.zeros(3, dtype=torch.float64)), R.t(torch.zeros(3)), step=1)


@pytest.mark.parametrize("fused", [False, True])
def test_adam_gives_the_same_bits_on_one_thread_or_two(fused):
    """Workers run different thread counts: torch's fused kernel splits a tensor among threads at 64-byte units,
    and the single-tensor update is elementwise kernels, so every element takes the same (vectorised or scalar)
    path either way."""
    g = torch.Generator().manual_seed(0)
    n = 1_000_003   # many units per thread, and a scalar tail
    state = [torch.randn(n, generator=g), torch.randn(n, generator=g), torch.randn(n, generator=g) * 0.1,
             torch.rand(n, generator=g) * 0.01, torch.zeros(n)]
    kernel = registry.REGISTRY["adamw_step"].kernel
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append(kernel(*state, step=3, lr=0.01, weight_decay=0.1, fused=fused))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(*results))


@pytest.mark.parametrize("options", [{}, {"weight_decay": 0.1}, {"weight_decay": 0.1, "decoupled": True},
                                     {"amsgrad": True, "maximize": True, "weight_decay": 0.05}])
def test_adams_update_of_several_tensors_gives_each_tensors_own_bits(options):
    """The step compiler's group updates a model's tensors in one call (by torch._foreach_* ops on a CPU): each
    tensor gets the bits of its own single-tensor update, the op's kernel."""
    g = torch.Generator().manual_seed(5)
    shapes = [(15, 4), (15,), (30, 15), (1,), (3, 30, 2)]

    def state():
        return [[torch.randn(s, generator=g) for s in shapes], [torch.randn(s, generator=g) for s in shapes],
                [torch.randn(s, generator=g) * 0.1 for s in shapes], [torch.rand(s, generator=g) * 0.01 for s in shapes],
                [torch.rand(s, generator=g) * 0.02 for s in shapes]]
    settings = {"weight_decay": 0.0, "amsgrad": False, "maximize": False, "decoupled": False, **options}
    together = state()
    alone = [[t.clone() for t in tensors] for tensors in together]
    for step in (1, 2, 3):
        optim.single_tensor_adam_(*together, step, 0.01, 0.9, 0.999, 1e-8, **settings)
        for k in range(len(shapes)):
            optim.single_tensor_adam_(*[[tensors[k]] for tensors in alone], step, 0.01, 0.9, 0.999, 1e-8, **settings)
    for tensors, want in zip(together, alone):
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(tensors, want))
