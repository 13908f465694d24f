"""Hand-written training loops folded by the compiler (compiler/passes/loops.py): a user loop that records the
same step again and again compiles into a loop op with one template, runs on the workers with the unrolled
steps' bits, and steps that differ (a learning-rate schedule, a short last batch, a branch on the epoch)
are not folded wrongly."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from compiler import compile_graph
from compiler.passes import loops as loops_pass
import ravop as R
from helpers import on_one_thread
from ravdl.v2 import Functional
from ravdl.v2.layers import Activation, BatchNormalization1D, CustomLayer, Dense, Dropout
from ravdl.v2.optimizers import Adam
from ravdl.v2.utils import batch_iterator
from ravop.runtime.evaluate import evaluate_persisted

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(1)
X = RNG.normal(size=(53, 4))
Y = np.eye(3)[RNG.integers(0, 3, 53)]


class Block(CustomLayer):
    def __init__(self):
        super().__init__()
        self.dense, self.norm, self.dropout = Dense(12, input_shape=(4,)), BatchNormalization1D(), Dropout(0.2)

    def _forward_pass_call(self, input, training=True):
        return self.dropout._forward_pass(self.norm._forward_pass(self.dense._forward_pass(input), training=training),
                                          training=training)


class Net(Functional):
    """The shape of examples/original_ann_functional.py: CustomLayers, BatchNorm, Dropout, Adam."""

    def __init__(self, lr=0.01):
        super().__init__()
        self.block, self.act, self.out = Block(), Activation("relu"), Dense(3)
        self.initialize_params(Adam(lr=lr))

    def _forward_pass_call(self, input, training=True):
        return self.out._forward_pass(self.act._forward_pass(self.block._forward_pass(input, training=training)))


def user_loop(epochs, batch_size=10, n_rows=53, lr=None, branch=False, seed=4):
    """Record a user's training loop (the original scripts' style); returns the graph. `lr(epoch)` sets the
    optimizer's learning rate each epoch; `branch` adds an op on odd epochs."""
    graph = R.Graph(name=f"user loop {epochs}", seed=seed)
    model = Net()
    for epoch in range(epochs):
        if lr is not None:
            model.optimizer.hyper["lr"] = lr(epoch)   # a schedule, as torch.optim users set param_groups
        for b, (X_batch, y_batch) in enumerate(batch_iterator(X[:n_rows], Y[:n_rows], batch_size=batch_size)):
            out = model._forward_pass(R.t(X_batch))
            loss = R.square_loss(R.t(y_batch), out)
            if branch and epoch % 2:
                loss = loss * 1.0
            model._backward_pass(loss)
            loss.persist_op(f"loss_{epoch}_{b}")
    model._forward_pass(R.t(X), training=False).persist_op("prediction")
    return graph


def loops_of(compiled):
    return [sub.loop for sub in compiled.plan.subgraphs if sub.HasField("loop")]


def run_on_workers(graph):
    """{name: tensor} of every name the plan persists, computed by the workers."""
    R.activate()
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    return {name: R.fetch_persisting_op(name) for name in list(graph.persisted)}


def assert_folded_equals_unrolled(record, monkeypatch):
    """The workers' values for the folded plan equal, bit for bit, theirs for the same loop compiled without
    folding (the unrolled steps), and the in-process run of the folded plan's loops."""
    graph = record()
    folded_plan = compile_graph(graph)
    assert loops_of(folded_plan)
    got = run_on_workers(graph)
    with monkeypatch.context() as patch:
        patch.setattr(loops_pass, "_fold_once", lambda ir: (ir, 0))   # the pass finds nothing to fold
        unrolled = record()
        assert not loops_of(compile_graph(unrolled))
        want = run_on_workers(unrolled)
    assert set(got) == set(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name


# ------------------------------------------------------------------------------ folding, in the compiler

def test_a_user_loop_folds_into_one_template_and_the_plan_stays_flat_in_epochs():
    """48 rows in batches of 8: every step alike, so epochs 1..n fold into one loop of one template."""
    sizes = []
    for epochs in (2, 10):
        compiled = compile_graph(user_loop(epochs, batch_size=8, n_rows=48))
        loops = loops_of(compiled)
        assert len(loops) == 1 and len(loops[0].templates) == 1
        steps = epochs * 6
        assert steps - 3 <= loops[0].n_steps <= steps   # the first step (it makes the Adam moments) stays apart
        template = loops[0].templates[0]
        assert len(template.run_holes) == 2   # the batch and its labels: a different constant per step
        assert len(template.output_nodes) == 1   # the loss, persisted at every run under its own name
        sizes.append((compiled.summary["compiled_ops"], len(compiled.constants),
                      len(template.nodes.SerializeToString())))
    assert sizes[0] == sizes[1]   # ops compiled, constants uploaded (each batch once) and the template


def test_steps_that_differ_are_not_folded_together():
    # A short last batch (53 rows in batches of 10): its step has other shapes.
    for loop in loops_of(compile_graph(user_loop(3))):
        template = loop.templates[0]
        batch = [d for d, n in zip(template.nodes.shape, template.nodes.op) if n == "linear"]
        assert loop.n_steps >= 2 and batch
    # A learning rate changed every epoch is a param of the optimizer step: epochs fold on their own.
    compiled = compile_graph(user_loop(4, batch_size=8, n_rows=48, lr=lambda e: 0.01 / (e + 1)))
    assert all(loop.n_steps <= 6 for loop in loops_of(compiled)) and len(loops_of(compiled)) >= 3
    # An op recorded on odd epochs only: no template mixes the two kinds of step.
    compiled = compile_graph(user_loop(4, batch_size=8, n_rows=48, branch=True))
    assert all(loop.n_steps <= 6 for loop in loops_of(compiled)) and len(loops_of(compiled)) >= 3


def test_a_raw_op_loop_with_a_learning_rate_per_step_folds_with_the_rate_as_a_value_per_run():
    graph = R.Graph(name="raw")
    w = R.t(torch.tensor([4.0, -2.0]))
    for k in range(12):
        lr = R.t(torch.tensor(0.1 / (k + 1)))      # a new constant each step: a hole filled per run
        w = w - lr * (2.0 * w)
        (w * w).sum().persist_op(f"loss_{k}")
    w.persist_op("final")
    compiled = compile_graph(graph)
    loops = loops_of(compiled)
    assert sum(loop.n_steps for loop in loops) >= 10   # the first step computes on constants: it differs
    assert all(len(loop.templates[0].run_holes) == 1 for loop in loops)
    values = on_one_thread(evaluate_persisted, graph)
    want, w_k = [], np.array([4.0, -2.0], dtype=np.float32)
    for k in range(12):
        w_k = w_k - np.float32(0.1 / (k + 1)) * (np.float32(2.0) * w_k)
        want.append(float((w_k * w_k).sum()))
    assert [float(values[f"loss_{k}"]) for k in range(12)] == pytest.approx(want, rel=1e-6)


@pytest.fixture
def small_gpt_sort(monkeypatch):
    """examples/gpt_sort.py's `record` (its GPT, data and user loop) at a reduced width and batch: a function
    steps -> graph. Its step repeats ops inside itself (2 blocks of 3 projections, an Adam update per
    parameter), which once hid the step's own length from the pass's candidate periods."""
    spec = importlib.util.spec_from_file_location("gpt_sort_example", ROOT / "examples" / "gpt_sort.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.setattr(example, "EMBED", 12)
    monkeypatch.setattr(example, "BATCH", 8)
    data = example.sort_data()

    def record(steps):
        graph = R.Graph(name=f"gpt sort {steps}", seed=5)
        example.record(steps, *data)
        return graph
    return record


def test_a_hand_written_transformer_loop_folds_into_one_template(small_gpt_sort):
    sizes = []
    for steps in (4, 12):
        compiled = compile_graph(small_gpt_sort(steps))
        loops = loops_of(compiled)
        assert len(loops) == 1 and len(loops[0].templates) == 1, compiled.summary
        assert steps - 2 <= loops[0].n_steps <= steps   # the first step (it makes the Adam moments) stays apart
        sizes.append(compiled.summary["compiled_ops"])
    assert sizes[0] == sizes[1]   # the plan does not grow with the steps
    assert compiled.summary["recorded_ops"] > 6 * sizes[1]   # 12 steps recorded, about two compiled


# ------------------------------------------------------------------------------ on the engine

def test_a_folded_transformer_loop_gives_the_unrolled_bits_on_the_workers(small_gpt_sort, engine, workers,
                                                                            monkeypatch):
    workers.start(1)
    assert_folded_equals_unrolled(lambda: small_gpt_sort(4), monkeypatch)


@pytest.mark.parametrize("variant", [
    dict(batch_size=8, n_rows=48),                              # one loop (dropout draws the unrolled masks)
    dict(),                                                     # short last batches
    dict(batch_size=8, n_rows=48, lr=lambda e: 0.02 / (e + 1)),  # a learning-rate schedule
    dict(batch_size=8, n_rows=48, branch=True)])                 # a branch on the epoch
def test_folded_user_loops_give_the_unrolled_bits_on_the_workers(variant, engine, workers, monkeypatch):
    workers.start(1)
    assert_folded_equals_unrolled(lambda: user_loop(3, **variant), monkeypatch)
