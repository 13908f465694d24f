"""Kernels make their outputs on the worker's device: every registry op's samples, a RavDL training step with
each optimizer and a Pytorch_Model step run on a device other than the CPU, and every output is checked to be
there and to equal the CPU's value.

No GPU is needed: the device is tests/pretend_device.py's, which reports itself as `meta`, computes on the
host and, like CUDA, refuses an op that mixes its tensors with CPU ones. A kernel that makes a CPU tensor
(`torch.zeros(shape)` with no device) fails here as it fails on a GPU worker. On a machine with CUDA the same
tests also run on the GPU, checking where the outputs are (their values are benchmarks/gpu_parity.py's job).
"""
import contextlib

import numpy as np
import pytest
import torch
from torch import nn

from compiler import compile_graph
from ravdl.v2 import NeuralNetwork, Pytorch_Model
from ravdl.v2.layers import (Activation, BatchNormalization2D, Conv2D, Dense, Dropout, Embedding, Flatten,
                             LayerNormalization, MaxPooling2D)
from ravdl.v2.optimizers import Adam, AdamW, RMSprop
import ravop as R
from ravop.record.graph import current_graph, to_tensor
from ravop.runtime.evaluate import evaluate
from worker.execute.device import to_device, to_host, use_full_precision
from worker.execute.run import run
from worker.execute.validate import check

from helpers import on_one_thread
from pretend_device import on_device, pretend_device
from test_registry_walk import CASES, _record

OPTIMIZERS = {"Adam": lambda: Adam(lr=0.01), "RMSprop": lambda: RMSprop(lr=0.01),
              "AdamW": lambda: AdamW(lr=0.01, weight_decay=0.1)}


class Target:
    """A device to run kernels on: `enter()` is a context giving the torch.device, `holds(value)` tells its
    tensors, `exact` whether its values must equal the CPU's bit for bit."""

    def __init__(self, name, enter, holds, exact):
        self.name, self.enter, self.holds, self.exact = name, enter, holds, exact

    def __repr__(self):
        return self.name


TARGETS = [Target("pretend", pretend_device, on_device, exact=True)]
if torch.cuda.is_available():
    TARGETS.append(Target("cuda", lambda: contextlib.nullcontext(torch.device("cuda")),
                          lambda v: isinstance(v, torch.Tensor) and v.device.type == "cuda", exact=False))


def _assert_on_device(target, values, what):
    off = [(i, v.device if isinstance(v, torch.Tensor) else type(v).__name__)
           for i, v in enumerate(values) if not target.holds(v)]
    assert not off, f"{what}: outputs {off} are not on the worker's device"


def _assert_same(target, got, want, what):
    if target.exact:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("target", TARGETS, ids=repr)
@pytest.mark.parametrize("name, sample", CASES)
def test_op_runs_on_the_device(name, sample, target):
    R.Graph(name=f"device-{name}")
    outputs, _ = _record(name, [to_tensor(x) for x in sample.inputs], sample.params)
    want = evaluate(outputs)
    with target.enter() as device:
        got = evaluate(outputs, device=device)
    _assert_on_device(target, got, name)
    for value, expected in zip(got, want):
        _assert_same(target, to_host(value), expected, name)


def _subgraphs_in_order(plan):
    remaining = {s.id: s.n_predecessors for s in plan.subgraphs}
    by_id = {s.id: s for s in plan.subgraphs}
    ready = [i for i, n in remaining.items() if n == 0]
    while ready:
        subgraph = by_id[ready.pop()]
        yield subgraph
        for successor in subgraph.successors:
            remaining[successor] -= 1
            if remaining[successor] == 0:
                ready.append(successor)


def run_like_a_worker(target, names):
    """Compile the current graph and run its subgraphs as a worker on the target device does (the store
    holds host tensors, as Redis does); returns {persist name: host tensor}. Asserts every subgraph's
    outputs are on the device."""
    graph = current_graph()
    compiled = compile_graph(graph)
    store = dict(compiled.constants)
    with target.enter() as device:
        for subgraph in _subgraphs_in_order(compiled.plan):
            program = check(subgraph, 2**40)
            inputs = {i: to_device(store[i], device) for i in subgraph.inputs}
            outputs = run(program, inputs, compiled.plan.seed, device, budget=2**40)
            ops = {step.id: step.op for step in program.steps}
            _assert_on_device(target, list(outputs.values()), f"subgraph {subgraph.id} (ops {sorted(set(ops.values()))})")
            store.update({i: to_host(t) for i, t in outputs.items()})
    return {name: store[compiled.plan.persisted[name]] for name in names}


def _cnn(optimizer):
    model = NeuralNetwork(optimizer=optimizer, loss="CrossEntropy")
    for layer in (Conv2D(1, 4, 3, padding="same", input_shape=(1, 6, 6)), Activation("relu"), MaxPooling2D(2),
                  Dropout(0.2), BatchNormalization2D(4), Flatten(), Dense(8), Activation("relu"), Dense(3),
                  Activation("softmax")):
        model.add(layer)
    return model


def _tokens(optimizer):
    """Dense(256) has more weights than the compiler folds (compiler/passes/fold.py), so workers make its
    optimizer moments (R.zeros)."""
    model = NeuralNetwork(optimizer=optimizer, loss="SquareLoss")
    for layer in (Embedding(10, 6), LayerNormalization(), Flatten(), Dense(256), Activation("tanh"), Dense(2)):
        model.add(layer)
    return model


@pytest.mark.parametrize("target", TARGETS, ids=repr)
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_ravdl_training_steps_run_on_the_device(optimizer, target):
    R.Graph(name=f"device-ravdl-{optimizer}", seed=3)
    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(8, 1, 6, 6)).astype(np.float32), np.eye(3)[rng.integers(0, 3, 8)]
    tokens, targets = rng.integers(0, 10, size=(8, 4)), rng.normal(size=(8, 2)).astype(np.float32)
    cnn, token_model = _cnn(OPTIMIZERS[optimizer]()), _tokens(OPTIMIZERS[optimizer]())
    for step, batch in enumerate((slice(0, 4), slice(4, 8))):
        cnn.train_on_batch(images[batch], labels[batch]).persist_op(f"cnn_loss_{step}")
        token_model.train_on_batch(tokens[batch], targets[batch]).persist_op(f"token_loss_{step}")
    cnn.predict(images).persist_op("cnn_prediction")
    names = sorted(current_graph().persisted)
    want = dict(zip(names, on_one_thread(evaluate, [current_graph().persisted[n] for n in names])))
    got = on_one_thread(run_like_a_worker, target, names)
    for name in names:
        _assert_same(target, got[name], want[name], name)


class _SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(4 * 6 * 6, 3))

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))))


@pytest.mark.parametrize("target", TARGETS, ids=repr)
def test_pytorch_model_step_runs_on_the_device(target):
    R.Graph(name="device-torchscript", seed=5)
    torch.manual_seed(0)
    model = Pytorch_Model(R.model(_SmallCNN()))
    model.initialize(AdamW(lr=0.01))
    rng = np.random.default_rng(1)
    for step in range(2):
        x, y = rng.normal(size=(4, 1, 6, 6)).astype(np.float32), np.eye(3)[rng.integers(0, 3, 4)]
        loss = R.cross_entropy_loss(R.t(y), model._forward_pass(R.t(x)))
        model._backward_pass(loss)
        loss.persist_op(f"loss_{step}")
    model._forward_pass(R.t(x), training=False).persist_op("prediction")
    names = ["loss_0", "loss_1", "prediction"]
    # one thread on both sides, as compile_graph's constant folding computes: a conv's bias before batch norm
    # has a gradient of pure rounding noise, which another summation order changes and Adam scales to lr
    want = on_one_thread(evaluate, [current_graph().persisted[n] for n in names])
    got = on_one_thread(run_like_a_worker, target, names)
    for name, expected in zip(names, want):
        _assert_same(target, got[name], expected, name)


def test_the_pretend_device_refuses_what_a_gpu_refuses():
    """The check above is only as good as the device: a CPU tensor mixed in, or made by a factory that was
    not told the device, is caught."""
    with pretend_device() as device:
        x = torch.ones(3).to(device)
        with pytest.raises(RuntimeError, match="same device"):
            x + torch.zeros(3)
        assert not on_device(torch.zeros(3))
        with torch.device(device):
            assert on_device(torch.zeros(3)) and on_device(torch.tensor([1, 2]))
        assert torch.equal(to_host(x * 2), torch.full((3,), 2.0))


def test_a_gpu_worker_computes_in_full_float32():
    """TF32 convolutions (cuDNN's default) would put a GPU worker ~1e-3 off a CPU worker's results."""
    flags = (torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32"), \
        (torch.backends.cudnn, "deterministic")
    saved = [getattr(owner, name) for owner, name in flags]
    try:
        use_full_precision(torch.device("cpu"))
        assert [getattr(owner, name) for owner, name in flags] == saved
        use_full_precision(torch.device("cuda", 0))
        assert [getattr(owner, name) for owner, name in flags] == [False, False, True]
    finally:
        for (owner, name), value in zip(flags, saved):
            setattr(owner, name, value)
