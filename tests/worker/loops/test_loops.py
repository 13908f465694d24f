"""Training loops as step templates (ravop.record.loop, ravdl.v2.fit, worker.loops.loop_subgraph): one step recorded,
compiled and shipped once, the same numbers as the unrolled steps, checkpoints and resuming after a worker is killed."""
import time

import numpy as np
import pytest
import torch

from compiler import compile_graph
from ravdl.v2 import Functional, NeuralNetwork, Pytorch_Model, trained_values
from ravdl.v2.fit import record_fit
from ravdl.v2.layers import Activation, BatchNormalization1D, Dense, Dropout
from ravdl.v2.optimizers import Adam
from ravdl.v2.utils import batch_iterator
import ravop as R
from ravop.core.errors import GraphStateError
from ravop.record.loop import Batches, Loop
from ravop.runtime.evaluate import evaluate, evaluate_persisted
from ravop.runtime.loop_run import LoopRun
from ravop.store import GraphKeys
from ravop.store import graphs as store_graphs
from ravop.wire import unpack_loop, unpack_nodes
from ravop.wire.persisted import persisted_ids
from helpers import on_one_thread

RNG = np.random.default_rng(0)
X = RNG.normal(size=(53, 4))
Y = np.eye(3)[RNG.integers(0, 3, 53)]


def model(dropout=False, validation=True):
    m = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss", validation_data=(X[:10], Y[:10]) if validation else None)
    m.add(Dense(16, input_shape=(4,)))
    m.add(BatchNormalization1D())
    m.add(Activation("relu"))
    if dropout:
        m.add(Dropout(0.2))
    m.add(Dense(3))
    return m


def unrolled_losses(m, epochs, batch_size, seed):
    """The same training recorded step by step, as a user loop writes it."""
    order = np.random.default_rng(seed)
    losses = []
    for _ in range(epochs):
        for X_batch, y_batch in batch_iterator(X, Y, batch_size, shuffle=True, seed=order):
            losses.append(m.train_on_batch(X_batch, y_batch))
        losses.append(m.loss_function(R.t(torch.tensor(Y[:10], dtype=torch.float32)), m.predict(X[:10])))
    return losses


def fit_names(epochs, n_batches):
    names = []
    for e in range(1, epochs + 1):
        names += [f"training_loss_epoch_{e}_batch_{b}" for b in range(1, n_batches + 1)]
        names.append(f"validation_loss_epoch_{e}")
    return names


# ------------------------------------------------------------------------------ recording and numbers

def test_fit_loop_gives_the_unrolled_steps_bits_with_shuffle_batchnorm_short_batch_and_validation():
    graph = R.Graph(name="loop", seed=5)
    m = model()
    m.fit(X, Y, n_epochs=3, batch_size=10, shuffle=True, seed=7)   # 53 rows: 5 batches of 10 and one of 3
    m.predict(X).persist_op("prediction")
    values = evaluate_persisted(graph)
    R.Graph(name="unrolled", seed=5)
    reference = model()
    want = evaluate(unrolled_losses(reference, 3, 10, 7) + [reference.predict(X)])
    got = [values[name] for name in fit_names(3, 6)] + [values["prediction"]]
    assert len(got) == len(want) == 3 * 7 + 1
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    # Python-side counters continue as after the unrolled steps: optimizer step counts, BatchNorm's batches.
    assert [s["step"] for s in m.optimizer.state.values()] == [s["step"] for s in reference.optimizer.state.values()]
    assert m.layers[1].batches_tracked == reference.layers[1].batches_tracked == 18


class TwoLayers(Functional):
    def __init__(self):
        super().__init__()
        self.first, self.second = Dense(8, input_shape=(4,)), Dense(3)
        self.initialize_params(Adam(lr=0.02))

    def _forward_pass_call(self, input, training=True):
        return self.second._forward_pass(R.tanh(self.first._forward_pass(input, training)), training)


def _torch_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 3))


@pytest.mark.parametrize("kind", ["functional", "pytorch_model"])
def test_record_fit_trains_functional_and_pytorch_models_as_their_unrolled_steps(kind):
    def make():
        if kind == "functional":
            return TwoLayers()
        model = Pytorch_Model(R.model(_torch_net()))
        model.initialize(Adam(lr=0.02))
        return model

    def train_step(model):
        def step(X_batch, y_batch):
            loss = R.square_loss(y_batch, model._forward_pass(X_batch))
            model._backward_pass(loss)
            return loss
        return step

    graph = R.Graph(name=kind, seed=1)
    model = make()
    names = record_fit(model, train_step(model), X, Y, n_epochs=2, batch_size=20)
    model._forward_pass(X, training=False).persist_op("prediction")
    values = evaluate_persisted(graph)
    R.Graph(name=f"{kind} unrolled", seed=1)
    reference = make()
    step = train_step(reference)
    losses = [step(R.t(torch.tensor(X_batch, dtype=torch.float32)), R.t(torch.tensor(y_batch, dtype=torch.float32)))
              for _ in range(2) for X_batch, y_batch in batch_iterator(X, Y, 20)]
    want = evaluate(losses + [reference._forward_pass(X, training=False)])
    got = [values[name] for name in names] + [values["prediction"]]
    assert len(got) == len(want) == 2 * 3 + 1
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_recording_and_plan_do_not_grow_with_epochs():
    sizes = []
    for epochs in (1, 8):
        graph = R.Graph(name=f"epochs{epochs}")
        model().fit(X, Y, n_epochs=epochs, batch_size=10)
        compiled = compile_graph(graph)
        loops = [sub for sub in compiled.plan.subgraphs if sub.HasField("loop")]
        assert len(loops) == 1 and loops[0].loop.n_steps == epochs * 7
        assert len(loops[0].loop.templates) == 3   # full batch, short batch, validation
        sizes.append((len(graph.nodes), compiled.summary["compiled_ops"], len(compiled.constants),
                      len(loops[0].loop.templates[0].nodes.SerializeToString())))
        # the losses, and the values a later graph starts from (ravdl.v2.trained_values), as many for any epochs
        # (the losses by rule: the plan holds as many entries for any epochs, persisted_ids names them all)
        names = persisted_ids(compiled.plan)
        losses = [name for name in names if not name.startswith(trained_values.PREFIX)]
        assert len(losses) == epochs * 7 and len(names) - len(losses) == 20
        assert len(compiled.plan.persisted) == 20 and len(compiled.plan.persist_rules) == 3   # per template
    assert sizes[0] == sizes[1]


def test_dropout_draws_a_new_mask_at_every_step_and_the_same_ones_on_every_run():
    def losses():
        graph = R.Graph(name="dropout", seed=3)
        model(dropout=True, validation=False).fit(X[:40], Y[:40], n_epochs=2, batch_size=40)
        values = evaluate_persisted(graph)
        return torch.stack([values[f"training_loss_epoch_{e}_batch_1"] for e in (1, 2)])

    first, second = losses(), losses()
    assert torch.equal(first, second)
    graph = R.Graph(name="masks", seed=3)
    x = R.t(torch.ones(1000))
    loop = Loop([x])
    with loop.step() as step:
        dropped = R.dropout(step.carried[0], p=0.5, training=True)
        step.persist(dropped, ["mask_1", "mask_2"])
        step.carry([step.carried[0]])
    loop.run([(0, 2)])
    masks = evaluate_persisted(graph)
    assert not torch.equal(masks["mask_1"], masks["mask_2"])


def test_a_raw_op_loop_with_a_changing_learning_rate_passes_it_as_carried_state():
    """A schedule is state: what changes between steps is carried (or sliced per step), never baked in."""
    graph = R.Graph(name="schedule")
    w, lr = R.t(torch.tensor([4.0])), R.t(torch.tensor(0.25))
    loop = Loop([w, lr])
    with loop.step() as step:
        w_now, lr_now = step.carried
        step.persist(w_now, [f"w_{k}" for k in range(3)])
        step.carry([w_now - lr_now * 2.0 * w_now, lr_now * 0.5])
    final_w, _ = loop.run([(0, 3)])
    final_w.persist_op("final")
    values = evaluate_persisted(graph)
    want, lr_k, w_k = [], 0.25, 4.0   # gradient descent on w**2 with a halving learning rate
    for _ in range(3):
        want.append(w_k)
        w_k, lr_k = w_k - lr_k * 2 * w_k, lr_k / 2
    assert [float(values[f"w_{k}"]) for k in range(3)] == want
    assert float(values["final"]) == w_k


def test_loop_mistakes_are_named():
    R.Graph(name="mistakes")
    w = R.t(torch.ones(3))
    loop = Loop([w])
    with pytest.raises(ValueError, match="keep its shape"):
        with loop.step() as step:
            step.carry([R.t(torch.ones(4))])
    R.Graph(name="persist inside")
    w = R.t(torch.ones(3))
    loop = Loop([w])
    with pytest.raises(GraphStateError, match="step.persist"):
        with loop.step() as step:
            (step.carried[0] * 2).persist_op("doubled")
    graph = R.Graph(name="read after")
    w = R.t(torch.ones(3))
    loop = Loop([w])
    with loop.step() as step:
        inside = step.carried[0] * 2
        step.carry([inside])
    final, = loop.run([(0, 2)])
    final.persist_op("final")
    (inside + 1).persist_op("leaked")
    with pytest.raises(GraphStateError, match="inside a loop step"):
        compile_graph(graph)
    R.Graph(name="batches")
    data = R.t(torch.ones(25, 2))
    loop = Loop([R.t(torch.ones(2))], Batches(25, 10))
    with loop.step() as step:
        step.carry([step.carried[0] + step.rows(data, 10).sum(axis=0)])
    with pytest.raises(ValueError, match="batch 3 has 5"):
        loop.run([(0, 3)])


def test_a_user_loop_that_records_each_batch_again_uploads_each_batch_once():
    def record(epochs):
        graph = R.Graph(name=f"user loop {epochs}")
        m = model(validation=False)
        for epoch in range(epochs):
            for b, (X_batch, y_batch) in enumerate(batch_iterator(X, Y, 10)):
                m.train_on_batch(X_batch, y_batch).persist_op(f"loss_{epoch}_{b}")
        return graph

    graph = record(3)
    recorded = [graph.constants[op.id] for op in graph.nodes if op.op == "const" and op.shape in ((10, 4), (3, 4))]
    assert len(recorded) == 3 * 6   # R.t(X_batch) of 6 batches, each epoch
    uploaded = [t for t in compile_graph(graph).constants.values() if tuple(t.shape) in ((10, 4), (3, 4))]
    assert len(uploaded) == 6
    assert all(any(torch.equal(t, u) for u in uploaded) for t in recorded)
    values = evaluate_persisted(graph)
    assert not torch.equal(values["loss_0_0"], values["loss_1_0"])   # the same batch, trained weights


# ------------------------------------------------------------------------------ on the engine

def reference(graph):
    """The graph's persisted values computed in this process, as the test workers would."""
    return on_one_thread(evaluate_persisted, graph)


def _wait(condition, timeout=120, what="condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_fit_on_workers_streams_losses_and_equals_the_in_process_run(engine, workers, client):
    workers.start(1)
    graph = R.Graph(name="stream", seed=2)
    m = model()
    epochs = 60
    m.fit(X, Y, n_epochs=epochs, batch_size=10, shuffle=True)
    m.predict(X).persist_op("prediction")
    summary = R.activate()
    assert summary["loop_steps"] == epochs * 7
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    _wait(lambda: store_graphs.steps_done(client, keys) > 0, what="the first flushed steps")
    first = R.fetch_persisting_op("training_loss_epoch_1_batch_1")   # while the loop may still run
    R.track_progress(timeout=300, progress_bar=False)
    want = reference(graph)
    assert torch.equal(first, want["training_loss_epoch_1_batch_1"])
    for name in fit_names(epochs, 6) + ["prediction"]:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name
    assert store_graphs.steps_done(client, keys) == epochs * 7
    assert not client.keys(keys.prefix + "ckpt:*")   # dropped once the loop is done


def test_a_worker_killed_mid_fit_is_replaced_from_its_checkpoint_with_the_same_bits(engine, workers, client):
    names = workers.start(2, reclaim_idle=1.0, extra=("--checkpoint-steps", "40"))
    graph = R.Graph(name="resume", seed=9)
    m = model(dropout=True)
    epochs = 150
    m.fit(X, Y, n_epochs=epochs, batch_size=10, shuffle=True)
    m.predict(X).persist_op("prediction")
    R.activate()
    keys = GraphKeys(engine.token, graph.id)
    R.execute()
    _wait(lambda: client.keys(keys.prefix + "ckpt:*"), what="a checkpoint")
    loop_id = next(int(key.decode().rsplit(":", 1)[1]) for key in client.keys(keys.prefix + "ckpt:*")
                   if client.type(key) == b"hash" and client.hexists(key, "step"))   # not its tensors' keys
    holder = client.hget(keys.taken, loop_id).decode()
    done_before = store_graphs.steps_done(client, keys)
    early = R.fetch_persisting_op("training_loss_epoch_1_batch_1")
    workers.kill(holder)
    assert done_before < epochs * 7, "the loop ended before the kill: make it longer"
    R.track_progress(timeout=300, progress_bar=False)
    survivor = next(n for n in names if n != holder)
    assert client.hget(keys.ran, loop_id).decode() == survivor
    want = reference(graph)
    assert torch.equal(early, want["training_loss_epoch_1_batch_1"])
    for name in fit_names(epochs, 6) + ["prediction"]:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name


def test_dead_ops_and_repeated_ops_are_removed_inside_a_step_template():
    """A template is Nodes through the compiler's passes: an op read by nothing is culled, an op recorded twice
    is computed once, and the plan's template runs to the same numbers as the recorded one."""
    graph = R.Graph(name="template-passes", seed=3)
    x = R.t(torch.arange(4.0))
    loop = Loop([R.t(torch.ones(4))])
    with loop.step() as step:
        (w,) = step.carried
        R.exp(w)   # read by nothing
        step.carry([w * x + w * x])
    [final] = loop.run([(0, 3)])
    final.persist_op("w")
    compiled = compile_graph(graph)
    [sub] = [s for s in compiled.plan.subgraphs if s.HasField("loop")]
    assert list(sub.loop.templates[0].nodes.op) == ["mul", "add"]
    assert compiled.summary["cse_merged"] >= 1 and compiled.summary["dead_code_removed"] >= 1
    loop_node = unpack_nodes(sub.nodes)[0]
    inputs = [compiled.constants[i] for i in loop_node.inputs]
    [after] = LoopRun(unpack_loop(sub.loop), inputs, compiled.plan.seed).run()
    assert torch.equal(after, 8 * torch.arange(4.0) ** 3)
    assert torch.equal(after, evaluate(final))


def test_an_op_of_constants_inside_a_step_is_computed_once_by_the_compiler():
    """An op of a step that reads only constants gives the same value at every run: constant folding computes it
    at compile time and the step reads it as an input of the loop, with the same numbers."""
    graph = R.Graph(name="template-fold", seed=3)
    x = R.t(torch.arange(4.0))
    loop = Loop([R.t(torch.ones(4))])
    with loop.step() as step:
        (w,) = step.carried
        step.carry([w * (x + x)])
    [final] = loop.run([(0, 3)])
    final.persist_op("w")
    compiled = compile_graph(graph)
    [sub] = [s for s in compiled.plan.subgraphs if s.HasField("loop")]
    assert list(sub.loop.templates[0].nodes.op) == ["mul"]
    loop_node = unpack_nodes(sub.nodes)[0]
    inputs = [compiled.constants[i] for i in loop_node.inputs]
    assert len(inputs) == len(sub.loop.outer_ids) == 2   # the carried value and x + x: x is read no more
    assert torch.equal(inputs[1], 2 * torch.arange(4.0)) and x.id not in compiled.constants
    [after] = LoopRun(unpack_loop(sub.loop), inputs, compiled.plan.seed).run()
    assert torch.equal(after, 8 * torch.arange(4.0) ** 3) and torch.equal(after, evaluate(final))


def test_ops_declare_what_a_loop_step_changes_per_run():
    """The facts a loop reads are the op's declarations (no op names, no params' text): optimizer steps name
    their step counter and their in-place variant, dropout's backward the seed param following its forward's
    stream; a declaration naming a param the op does not have is refused when the op is registered."""
    from ravop.core import registry
    adam = registry.REGISTRY["adam_step"]
    assert adam.counter == "step" and adam.in_place.overwritten == (0, 2, 3)
    assert registry.REGISTRY["dropout_backward"].seed_param == "seed"
    assert registry.REGISTRY["arange"].counter is None   # its `step` param is a stride, not a count
    with pytest.raises(ValueError, match="counter='step', which is not one of its params"):
        registry.register("not_registered_twice", params={"lr": 0.1}, counter="step")(lambda x, lr: x)
    assert "not_registered_twice" not in registry.REGISTRY
