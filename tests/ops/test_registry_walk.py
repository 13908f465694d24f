"""Walk the op registry: every op has samples; each sample's value, declared shape and dtype are checked,
and every differentiable op's `R.grad` is checked against torch.autograd through the op's own kernel.

An op registered without samples in tests/samples fails `test_every_op_has_samples`.
"""
import pytest
import torch

import ravop as R
from ravop.core import registry
from ravop.record.api import FRONTENDS, make_function
from ravop.record.graph import to_tensor
from ravop.runtime.evaluate import evaluate, run_op
from tests.samples import all_samples

# Not user-callable: R.t makes constants, every multi-output sample exercises tuple_get, and loops, their
# holes and their decisions to stop are recorded by ravop.record.loop (tests/worker/loops/test_loops.py,
# tests/ravdl/test_loop_stopping.py).
INTERNAL = ("const", "tuple_get", "loop", "loop_hole", "loop_stop")
GRAD_RTOL, GRAD_ATOL = 1e-10, 1e-12

SAMPLES = all_samples()
OPDEFS = {d.name: d for d in registry.unique_opdefs() if d.name not in INTERNAL}
CASES = [pytest.param(name, sample, id=f"{name}-{i}")
         for name, samples in sorted(SAMPLES.items()) for i, sample in enumerate(samples)]


def _differentiable(name):
    opdef = registry.REGISTRY.get(name)
    return opdef is not None and opdef.vjp is not None


GRAD_CASES = [case for case in CASES if case.values[1].grad and _differentiable(case.values[0])]


def test_every_op_has_samples():
    missing = sorted(set(OPDEFS) - {registry.get(name).name for name in SAMPLES if name in registry.REGISTRY})
    assert not missing, f"ops without samples in tests/samples/: {missing}"


def test_samples_name_registered_ops():
    unknown = sorted(set(SAMPLES) - set(registry.REGISTRY))
    assert not unknown, f"samples for unregistered ops: {unknown}"


def test_every_differentiable_op_has_a_gradient_check():
    checked = {registry.get(case.values[0]).name for case in GRAD_CASES}
    missing = sorted(name for name, d in OPDEFS.items() if d.vjp is not None and name not in checked)
    assert not missing, f"differentiable ops without a grad=True sample: {missing}"


def _record(name, tensors, params):
    """Record op `name` on constants holding `tensors`; return (outputs as a list, the op's node)."""
    opdef = registry.get(name)
    # An op with a hand-written front end (R.index takes x[...]-style indices) is recorded through its
    # generated function, which takes the canonical params the samples give.
    fn = make_function(opdef) if opdef.name in FRONTENDS else getattr(R, name)
    ops = [R.t(t) for t in tensors]
    out = fn(ops, **params) if registry.get(name).variadic else fn(*ops, **params)
    outputs = list(out) if isinstance(out, tuple) else [out]
    node = outputs[0].inputs[0] if outputs[0].op == "tuple_get" else outputs[0]
    return outputs, node


def _as_list(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _check_declared(op, value):
    assert op.dtype == value.dtype, f"declared dtype {op.dtype}, kernel gave {value.dtype}"
    shape = tuple(value.shape)
    assert len(op.shape) == len(shape) and all(d in (-1, v) for d, v in zip(op.shape, shape)), \
        f"declared shape {op.shape}, kernel gave {shape}"


@pytest.mark.parametrize("name, sample", CASES)
def test_kernel(name, sample):
    R.Graph(name=f"walk-{name}")
    tensors = [to_tensor(x) for x in sample.inputs]
    outputs, node = _record(name, tensors, sample.params)
    values = evaluate(outputs)
    for op, value in zip(outputs, values):
        _check_declared(op, value)
    if sample.reference is not None:
        expected = _as_list(sample.reference(*tensors, **sample.params))
        assert len(expected) == len(values)
        for value, want in zip(values, expected):
            torch.testing.assert_close(value, torch.as_tensor(want), check_dtype=False, equal_nan=True)
    else:  # the kernel run eagerly on the same inputs, with the generator a random op would get
        expected = _as_list(run_op(registry.get(name), tensors, node.params, node.graph.seed, node.id))
        for value, want in zip(values, expected):
            torch.testing.assert_close(value, want, rtol=0, atol=0, equal_nan=True)


def _float64(t):
    return t.to(torch.float64) if t.is_floating_point() else t


@pytest.mark.parametrize("name, sample", GRAD_CASES)
def test_grad(name, sample):
    """R.grad of sum(out * cotangent) over the float outputs, against torch.autograd, in float64."""
    R.Graph(name=f"grad-{name}")
    tensors = [_float64(to_tensor(x)) for x in sample.inputs]
    outputs, node = _record(name, tensors, sample.params)
    wrt_index = [i for i, t in enumerate(tensors) if t.is_floating_point()]
    assert wrt_index, "a grad=True sample needs a floating-point input"
    float_outputs = [o for o in outputs if o.dtype.is_floating_point]
    assert float_outputs, "a grad=True sample needs a floating-point output"
    generator = torch.Generator().manual_seed(0)
    shapes = [tuple(v.shape) for v in evaluate(float_outputs)]  # concrete: a declared dim may be -1
    cotangents = [torch.randn(s, dtype=o.dtype, generator=generator) for o, s in zip(float_outputs, shapes)]
    loss = None
    for o, c in zip(float_outputs, cotangents):
        term = R.sum_to(o * R.t(c), shape=())
        loss = term if loss is None else loss + term
    grads = evaluate(R.grad(loss, [node.inputs[i] for i in wrt_index]))

    leaves = [t.clone().requires_grad_(i in wrt_index) for i, t in enumerate(tensors)]
    with torch.enable_grad():
        out = _as_list(run_op(registry.get(name), leaves, node.params, node.graph.seed, node.id))
        out = [o for o in out if o.is_floating_point()]
        total = sum((o * c).sum() for o, c in zip(out, cotangents))
        wrt = [leaves[i] for i in wrt_index]
        expected = torch.autograd.grad(total, wrt, allow_unused=True) if total.requires_grad else [None] * len(wrt)
    for i, got, want in zip(wrt_index, grads, expected):
        want = torch.zeros_like(tensors[i]) if want is None else want
        torch.testing.assert_close(got, want, rtol=GRAD_RTOL, atol=GRAD_ATOL, equal_nan=True,
                                   msg=lambda m: f"gradient w.r.t. input {i}: {m}")
