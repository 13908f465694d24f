"""Adam over packed buffers (ravop/packed_adam.py): the step compiler's grouped Adam packs a model's tensors into
flat buffers at its first update and hands back views, later updates run on the buffers, and every update gives
the bits of the op's own kernel run tensor by tensor; where packing is not allowed it runs per tensor."""
import pytest
import torch

from ravop import packed_adam, registry, step_compiler

SHAPES = [(16, 1, 3, 3), (16,), (10, 64), (10,), (3, 5, 7), (1,)]


def views_of(flat, shapes):
    out, at = [], 0
    for s in shapes:
        n = torch.Size(s).numel()
        out.append(flat[at:at + n].view(s))
        at += n
    return out


def test_packed_finds_the_buffer_of_consecutive_views_only():
    flat = torch.arange(40, dtype=torch.float32)
    views = views_of(flat, [(2, 3), (4,), (5, 2)])
    found = packed_adam.packed(views)
    assert found is not None and found.data_ptr() == flat.data_ptr() and found.numel() == 20
    assert packed_adam.packed([views[0], views[2]]) is None            # a gap
    assert packed_adam.packed([views[1], views[0]]) is None            # out of order
    assert packed_adam.packed([t.clone() for t in views]) is None      # separate tensors
    assert packed_adam.packed([flat[:6].view(3, 2).t()]) is None       # not contiguous
    assert packed_adam.packed([views[0], flat.double()[6:10]]) is None  # another dtype


def run_group(op, settings, steps=5, dtypes=None):
    """(per-tensor results, grouped results, the grouped results of each step) of `steps` Adam updates."""
    torch.manual_seed(0)
    dtypes = dtypes or [torch.float32] * len(SHAPES)
    state = [[torch.randn(s, dtype=d), torch.rand(s, dtype=d), torch.rand(s, dtype=d), torch.rand(s, dtype=d)]
             for s, d in zip(SHAPES, dtypes)]
    loop, grouped = [[t.clone() for t in one] for one in state], [[t.clone() for t in one] for one in state]
    kernel = registry.REGISTRY[op].in_place.kernel
    group = step_compiler._Group(op, len(SHAPES))
    each_step = []
    for step in range(1, steps + 1):
        grads = [torch.randn(s, dtype=d) for s, d in zip(SHAPES, dtypes)]
        loop = [list(kernel(p, g, a, b, c, step=step, **settings)) for (p, a, b, c), g in zip(loop, grads)]
        group(*[t for (p, a, b, c), g in zip(grouped, grads) for t in (p, g, a, b, c)], step=step, **settings)
        grouped = [list(result) for result in group.box]
        each_step.append(grouped)
    return loop, grouped, each_step


def same_bits(a, b):
    return torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a.view(torch.int64),
                       b.view(torch.int32) if b.dtype == torch.float32 else b.view(torch.int64))


@pytest.mark.parametrize("op, settings", [
    ("adam_step", {"lr": 0.01}),
    ("adam_step", {"lr": 0.003, "weight_decay": 0.1, "maximize": True, "beta1": 0.8}),
    ("adamw_step", {"lr": 0.01, "weight_decay": 0.05}),
    ("adam_step", {"lr": 0.01, "lr_schedule": {"kind": "step", "step_size": 2, "gamma": 0.5}}),
])
def test_the_group_packs_once_and_keeps_the_per_tensor_bits(op, settings):
    assert packed_adam.bitwise_safe()   # this machine's kernels agree (else packing is off: next test)
    loop, grouped, each_step = run_group(op, settings)
    for a, b in zip(loop, grouped):
        for x, y in zip(a, b[:3]):
            assert same_bits(x, y)
    for results in each_step:   # params, exp_avgs, exp_avg_sqs: views of one buffer each, the same from step 1
        for k in range(3):
            flat = packed_adam.packed([r[k] for r in results])
            assert flat is not None and flat.data_ptr() == packed_adam.packed([r[k] for r in each_step[0]]).data_ptr()


def test_without_packing_the_group_updates_tensor_by_tensor(monkeypatch):
    monkeypatch.setattr(packed_adam, "bitwise_safe", lambda: False)
    loop, grouped, _ = run_group("adam_step", {"lr": 0.01})
    assert packed_adam.packed([r[0] for r in grouped]) is None
    for a, b in zip(loop, grouped):
        for x, y in zip(a, b[:3]):
            assert same_bits(x, y)


def test_a_large_model_updates_tensor_by_tensor(monkeypatch):
    monkeypatch.setattr(packed_adam, "MAX_PACKED_BYTES", 1000)
    loop, grouped, _ = run_group("adam_step", {"lr": 0.01})
    assert packed_adam.packed([r[0] for r in grouped]) is None
    for a, b in zip(loop, grouped):
        for x, y in zip(a, b[:3]):
            assert same_bits(x, y)


def test_a_group_of_mixed_dtypes_updates_tensor_by_tensor():
    dtypes = [torch.float32, torch.float64] * (len(SHAPES) // 2)
    loop, grouped, _ = run_group("adam_step", {"lr": 0.01}, dtypes=dtypes)
    assert packed_adam.packed([r[0] for r in grouped]) is None
    for a, b in zip(loop, grouped):
        for x, y in zip(a, b[:3]):
            assert same_bits(x, y)


def test_tensors_given_in_another_layout_are_packed_again():
    """A loop resumed from a checkpoint, or after a sync that made new tensors, hands the group tensors that are
    not its views: it copies them into new buffers (the same values) and goes on packed."""
    state = packed_adam.PackedState()
    first = [[torch.randn(s) for s in SHAPES] for _ in range(3)]
    flats, views = state.buffers(first)
    assert all(packed_adam.packed(v) is not None for v in views)
    assert state.buffers(views)[0] is flats   # its own views: no check, no copy
    fresh = [[t.clone() + 1 for t in v] for v in views]
    again, again_views = state.buffers(fresh)
    assert again[0].data_ptr() != flats[0].data_ptr()
    for given, made in zip(fresh, again_views):
        assert all(torch.equal(a, b) for a, b in zip(given, made))
