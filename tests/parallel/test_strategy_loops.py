"""`R.Graph(..., strategy=...)` over a hand-written training loop (compiler/passes/strategy.py,
docs/users/strategies.md "Hand-written loops"): the loop the compiler folds becomes the strategy's resident replicas,
each running the loop's steps dealt to it round-robin; the steps left outside the loop run once. Checked against
an eager PyTorch implementation of those semantics written here, on a real server with worker processes; the plan
does not grow with the steps; bad combinations are refused by name."""
import copy

import numpy as np
import pytest
import torch

from compiler import ir as ir_module
from compiler.pass_manager import PIPELINE, run_pipeline
from compiler.passes.strategy import carried_kinds
from ravdl.v2 import Functional
from ravdl.v2.layers import BatchNormalization1D, Dense, Dropout
from ravdl.v2.optimizers import Adam
from ravdl.v2.utils import batch_iterator
import ravop as R
from ravop.client.graph_kinds import compile_planned
from ravop.core.errors import GraphStateError
from ravop.record.loop import Loop
from test_resident_replicas import run_killing_a_replica
from test_diloco import eager_send

RNG = np.random.default_rng(7)
X = RNG.normal(size=(160, 4)).astype(np.float32)
Y = RNG.normal(size=(160, 2)).astype(np.float32)
INITIAL = [RNG.normal(size=(4, 8)).astype(np.float32) * 0.5, np.zeros(8, np.float32),
           RNG.normal(size=(8, 2)).astype(np.float32) * 0.5, np.zeros(2, np.float32)]
BATCH, LR = 8, 0.05
NAMES = ["W1", "b1", "W2", "b2"]


def batch(s):
    """Step s's batch (after 20 steps the data's batches again)."""
    first = s % (len(X) // BATCH) * BATCH
    return X[first:first + BATCH], Y[first:first + BATCH]


def hand_written_loop(steps, strategy, name="hand-written"):
    """A user's loop of raw ops: a 4-8-2 MLP, its batch as R.t per step, R.grad and an Adam step per parameter,
    the loss persisted per step and the parameters after the last step."""
    graph = R.Graph(name=name, seed=5, strategy=strategy)
    params = [R.t(torch.tensor(p)) for p in INITIAL]
    states = [[R.t(torch.zeros(p.shape)) for _ in range(3)] for p in INITIAL]
    for s in range(steps):
        X_batch, y_batch = batch(s)
        W1, b1, W2, b2 = params
        out = R.matmul(R.relu(R.matmul(R.t(X_batch), W1) + b1), W2) + b2
        loss = R.mean((out - R.t(y_batch)) ** 2)
        grads = R.grad(loss, params)
        for k, (p, g) in enumerate(zip(params, grads)):
            params[k], *states[k] = R.adam_step(p, g, *states[k], step=s + 1, lr=LR)
        loss.persist_op(f"loss_{s}")
    for name, p in zip(NAMES, params):
        p.persist_op(name)
    return graph


# ------------------------------------------------------------------------------ the semantics in eager PyTorch

def eager_loss(params, s):
    X_batch, y_batch = (torch.as_tensor(a) for a in batch(s))
    W1, b1, W2, b2 = params
    return torch.mean((torch.relu(X_batch @ W1 + b1) @ W2 + b2 - y_batch) ** 2)


class Replica:
    """Parameters and a torch.optim.Adam over them (its default single-tensor update, as ravop's adam_step)."""

    def __init__(self, params, state=None):
        self.params = [p.detach().clone().requires_grad_() for p in params]
        self.opt = torch.optim.Adam(self.params, lr=LR)
        if state is not None:
            self.opt.load_state_dict({"state": copy.deepcopy(state), "param_groups": self.opt.state_dict()
                                      ["param_groups"]})

    def step(self, s):
        self.opt.zero_grad()
        loss = eager_loss(self.params, s)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def state(self):
        return self.opt.state_dict()["state"]

    def set_params(self, values):
        with torch.no_grad():
            for p, v in zip(self.params, values):
                p.copy_(v)


def mean_state(replicas, step):
    """The replicas' mean Adam moments, with the step count `step` (what the loop's last step records)."""
    states = [r.state() for r in replicas]
    return {k: {"step": torch.tensor(float(step)),
                "exp_avg": torch.stack([s[k]["exp_avg"] for s in states]).mean(0),
                "exp_avg_sq": torch.stack([s[k]["exp_avg_sq"] for s in states]).mean(0)} for k in states[0]}


def reference(steps, replicas, interval, sync):
    """(loss per step, parameters after the last step): step 0 once; the loop's steps 1..steps-2 dealt
    round-robin to `replicas` copies of the model and its Adam state, `sync(copies)` after every `interval` steps
    of a replica and after its last; the loop's steps of no full round and the last step once, as recorded, on
    `sync.final(copies)`'s model with the replicas' mean Adam state."""
    losses = {}
    first = Replica([torch.as_tensor(p) for p in INITIAL])
    losses[0] = first.step(0)
    copies = [Replica(first.params, first.state()) for _ in range(replicas)]
    loop = list(range(1, steps - 1))
    per_replica = len(loop) // replicas
    for j in range(per_replica):
        for r, replica in enumerate(copies):
            s = loop[j * replicas + r]
            losses[s] = replica.step(s)
        if (j + 1) % interval == 0 or j + 1 == per_replica:
            sync(copies)
    after = loop[per_replica * replicas:] + [steps - 1]   # the loop's steps of no full round, then the last one
    last = Replica(sync.final(copies), mean_state(copies, after[0]))
    for s in after:
        losses[s] = last.step(s)
    return losses, [p.detach() for p in last.params]


class Averaging:
    """LocalSGD's synchronisation: every replica takes the mean parameters."""

    def __call__(self, copies):
        mean = [torch.stack(ps).mean(0) for ps in zip(*(c.params for c in copies))]
        for c in copies:
            c.set_params(mean)

    def final(self, copies):
        return [p.detach() for p in copies[0].params]


class OuterSGD:
    """DiLoCo's synchronisation: the mean pseudo-gradient `start - params` (each sent with `compression` and its
    replica's error feedback) as the gradient of torch.optim.SGD over the global model, whose change is sent back
    the same way; every replica restarts from the global model, or with `overlap` from the one before this outer
    step (as tests/parallel/test_diloco.py's reference)."""

    def __init__(self, start, lr, momentum, nesterov, compression=None, overlap=False):
        self.glob = [torch.as_tensor(p).clone().requires_grad_() for p in start]
        self.outer = torch.optim.SGD(self.glob, lr=lr, momentum=momentum, nesterov=nesterov)
        self.start = [g.detach().clone() for g in self.glob]
        self.compression, self.overlap = compression, overlap
        self.up, self.down = {}, {}

    def __call__(self, copies):
        before = [g.detach().clone() for g in self.glob]
        for i, g in enumerate(self.glob):
            pseudo = [self.start[i] - c.params[i].detach() for c in copies]
            if self.compression:
                for r in range(len(copies)):
                    pseudo[r], self.up[r, i] = eager_send(pseudo[r], self.up.get((r, i)), self.compression)
            g.grad = torch.stack(pseudo).mean(0)
        self.outer.step()
        if self.compression:
            with torch.no_grad():
                for i, g in enumerate(self.glob):
                    received, self.down[i] = eager_send(g - before[i], self.down.get(i), self.compression)
                    g.copy_(before[i] + received)
        self.start = before if self.overlap else [g.detach().clone() for g in self.glob]
        for c in copies:
            c.set_params(self.start)

    def final(self, copies):
        return [g.detach() for g in self.glob]


class Pairing:
    """Gossip's synchronisation after every step: replicas paired by `gossip.pairs(steps done, graph seed)` each
    move `factor` of the way to their peer's parameters; the model after training is the replicas' mean."""

    def __init__(self, gossip, seed):
        self.gossip, self.seed, self.done = gossip, seed, 0

    def __call__(self, copies):
        self.done += 1
        before = [[p.detach().clone() for p in c.params] for c in copies]
        for i, j in self.gossip.pairs(self.done, self.seed):
            for a, b in ((i, j), (j, i)):
                copies[a].set_params([p + (q - p) * self.gossip.factor for p, q in zip(before[a], before[b])])

    def final(self, copies):
        return [torch.stack(ps).mean(0) for ps in zip(*(c.params for c in copies))]


# ------------------------------------------------------------------------------ on a real server

def run(graph, steps):
    summary = R.activate()
    assert list(summary["placement"]) == [repr(graph.strategy)]   # the forecast names the replicas
    assert f"replica {graph.strategy.replicas - 1} on" in str(summary)
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    return ({s: R.fetch_persisting_op(f"loss_{s}") for s in range(steps)},
            [R.fetch_persisting_op(name) for name in NAMES])


def assert_matches(got, want, atol=1e-5):
    (losses, params), (want_losses, want_params) = got, want
    assert sorted(losses) == sorted(want_losses)
    for s, loss in want_losses.items():
        assert torch.allclose(losses[s], loss, atol=atol), (s, float(losses[s]), float(loss))
    for name, p, w in zip(NAMES, params, want_params):
        assert (p - w).abs().max() <= atol, name


def first_step_model():
    """The model after step 0, from which every replica starts (what DiLoCo's global model starts as)."""
    first = Replica([torch.as_tensor(p) for p in INITIAL])
    first.step(0)
    return [p.detach() for p in first.params]


@pytest.mark.parametrize("steps", [14, 15])   # a loop of 12 steps, or of 13: its last runs once after the replicas
def test_local_sgd_over_a_folded_hand_written_loop_equals_eager_pytorch(steps, engine, workers):
    workers.start(2)
    strategy = R.parallel.LocalSGD(replicas=2, sync_every=2)
    graph = hand_written_loop(steps, strategy)
    assert_matches(run(graph, steps), reference(steps, 2, 2, Averaging()))


@pytest.mark.parametrize("knobs", [dict(), dict(compression="int8", overlap=True)])
def test_diloco_over_a_folded_hand_written_loop_equals_eager_pytorch(knobs, engine, workers):
    workers.start(2)
    steps, strategy = 14, R.parallel.DiLoCo(replicas=3, inner_steps=2, outer_lr=0.7, outer_momentum=0.9, **knobs)
    graph = hand_written_loop(steps, strategy)
    want = reference(steps, 3, 2, OuterSGD(first_step_model(), 0.7, 0.9, True, **knobs))
    assert_matches(run(graph, steps), want)


def test_gossip_over_a_folded_hand_written_loop_equals_eager_pytorch(engine, workers):
    workers.start(2)
    steps, strategy = 14, R.parallel.Gossip(replicas=3, factor=0.3)
    graph = hand_written_loop(steps, strategy)
    assert_matches(run(graph, steps), reference(steps, 3, 1, Pairing(strategy, graph.seed)))


def test_a_replica_whose_worker_is_killed_resumes_elsewhere_with_the_same_numbers(engine, workers, client):
    """A replica's loop checkpoints and is taken over like any resident replica's: the worker holding one is
    SIGKILLed after its first checkpoint, a spare resumes it, and the results still equal eager PyTorch's."""
    names = workers.start(3, reclaim_idle=1.0, extra=("--checkpoint-steps", "20"))
    steps, strategy = 402, R.parallel.LocalSGD(replicas=2, sync_every=2)
    graph = hand_written_loop(steps, strategy)
    keys, loop_id, holder = run_killing_a_replica(engine, workers, client, graph)
    assert client.hget(keys.ran, loop_id).decode() in set(names) - {holder}   # a spare took the replica over
    got = ({s: R.fetch_persisting_op(f"loss_{s}") for s in range(steps)}, [R.fetch_persisting_op(n) for n in NAMES])
    assert_matches(got, reference(steps, 2, 2, Averaging()))


# ------------------------------------------------------------------------------ the plan, in the compiler

def replica_loops(compiled):
    return [sub.loop for sub in compiled.plan.subgraphs if sub.HasField("loop")]


@pytest.mark.parametrize("strategy", [R.parallel.LocalSGD(2, sync_every=3), R.parallel.DiLoCo(2, inner_steps=3),
                                      R.parallel.DiLoCo(2, inner_steps=3, compression="int8", overlap=True)])
def test_the_plan_does_not_grow_with_the_number_of_steps(strategy):
    plans = []
    for steps in (8, 20):
        compiled = compile_planned(hand_written_loop(steps, strategy))
        loops = replica_loops(compiled)
        assert len(loops) == strategy.replicas and compiled.summary["loops_replicated"] == 1
        share = (steps - 2) // 2   # the loop's steps (the first and last run once) dealt to 2 replicas
        syncs = -(-share // 3)
        assert [loop.n_steps for loop in loops] == [share + syncs * len(loop.sync_templates) + len(loop.before_first)
                                                    for loop in loops]
        plans.append((compiled.summary["compiled_ops"], compiled.summary["subgraphs"],
                      [[len(t.nodes.op) for t in loop.templates] for loop in loops]))
    assert plans[0] == plans[1]


def test_each_replica_reads_only_the_batches_of_its_steps():
    compiled = compile_planned(hand_written_loop(8, R.parallel.LocalSGD(2, sync_every=2)))
    loops = replica_loops(compiled)
    shares = [set(loop.templates[0].run_values) for loop in loops]
    assert shares[0] and shares[1] and not shares[0] & shares[1]
    assert all(len(loop.templates[0].run_values) == 3 * len(loop.templates[0].run_holes) for loop in loops)


# ------------------------------------------------------------------------------ refused by name

@pytest.mark.parametrize("strategy, words", [
    (R.parallel.DataParallel(2), "DataParallel"),
    (R.parallel.Pipeline(2), "Pipeline"),
    (R.parallel.Gossip(2, interpolation="loss"), "Gossip"),
    (R.parallel.LocalSGD(2, sync_every=2, update_frequency=2), "update_frequency"),
    (R.parallel.DiLoCo(2, inner_steps=2, resident=False), "resident=False")])
def test_strategies_a_hand_written_loop_cannot_take_are_refused_by_name(strategy, words):
    with pytest.raises((NotImplementedError, ValueError), match=words) as raised:
        compile_planned(hand_written_loop(8, strategy))
    if isinstance(raised.value, NotImplementedError):
        assert "LocalSGD, DiLoCo" in str(raised.value)


def test_a_loop_of_fewer_steps_than_replicas_is_refused():
    with pytest.raises(ValueError, match="folds into 2 alike steps, fewer than LocalSGD.* replicas"):
        compile_planned(hand_written_loop(4, R.parallel.LocalSGD(3, sync_every=2)))


def test_the_steps_of_no_full_round_run_once_after_the_replicas():
    """A loop of 13 steps under 2 replicas: 6 each, and the 13th in a loop of its own reading their final model."""
    compiled = compile_planned(hand_written_loop(15, R.parallel.LocalSGD(2, sync_every=2)))
    loops = replica_loops(compiled)
    assert [loop.n_steps - len(loop.sync_templates) * 3 for loop in loops] == [6, 6, 1]
    tail = loops[2].templates[0]
    assert not loops[2].sync_templates and len(tail.run_values) == len(tail.run_holes)   # one step's batch


def test_a_loop_without_batches_per_step_is_refused():
    graph = R.Graph(name="no batches", strategy=R.parallel.DiLoCo(2, inner_steps=2))
    w, data = R.t(torch.tensor([1.0, -2.0])), R.t(torch.tensor(X[:8, :2]))
    for _ in range(8):
        loss = R.mean(R.matmul(data, w) ** 2)
        w = w - 0.1 * R.grad(loss, [w])[0]
    w.persist_op("w")
    with pytest.raises(ValueError, match="no batches to share"):
        compile_planned(graph)


def test_a_loop_that_carries_no_parameter_is_refused():
    graph = R.Graph(name="a count", strategy=R.parallel.LocalSGD(2, sync_every=2))
    seen = R.t(torch.tensor(0, dtype=torch.int64))
    for s in range(8):
        seen = seen + R.argmax(R.abs(R.t(X[s * 8:(s + 1) * 8]) * 2.0 + 1.0))   # an int64 count, no parameter
    seen.persist_op("seen")
    with pytest.raises(ValueError, match="carries no parameter"):
        compile_planned(graph)


def test_a_strategy_graph_with_no_fit_and_nothing_folded_is_refused():
    graph = R.Graph(name="nothing", strategy=R.parallel.LocalSGD(2, sync_every=2))
    (R.t([1.0, 2.0]) * 2.0).persist_op("twice")
    with pytest.raises(GraphStateError, match="no fit used it and no hand-written training loop folded"):
        compile_planned(graph)


def test_a_loop_recorded_with_ravop_loop_under_a_strategy_is_refused():
    graph = R.Graph(name="recorded", strategy=R.parallel.LocalSGD(2, sync_every=2))
    loop = Loop([R.t(torch.tensor([1.0]))])
    with loop.step() as step:
        step.carry([step.carried[0] * 0.5])
    loop.run([(0, 4)])[0].persist_op("w")
    with pytest.raises(NotImplementedError, match="ravop.record.loop.Loop"):
        compile_planned(graph)


# ------------------------------------------------------------------------------ a ravdl model's loop, on workers

class Net(Functional):
    """The shape of examples/original_ann_functional.py's model: Dense, BatchNorm, Dropout, Adam."""

    def __init__(self, dropout):
        super().__init__()
        self.dense, self.norm, self.out = Dense(8, input_shape=(4,)), BatchNormalization1D(), Dense(2)
        self.dropout = Dropout(0.2) if dropout else None
        self.initialize_params(Adam(lr=0.01))

    def _forward_pass_call(self, input, training=True):
        hidden = R.relu(self.norm._forward_pass(self.dense._forward_pass(input), training=training))
        if self.dropout is not None:
            hidden = self.dropout._forward_pass(hidden, training=training)
        return self.out._forward_pass(hidden)


def ravdl_loop(strategy, dropout=False, epochs=2, lr_per_epoch=False):
    """A user's loop over batch_iterator around _forward_pass/_backward_pass, as the original scripts wrote it;
    `lr_per_epoch`: a learning rate set each epoch, which makes each epoch a loop of its own."""
    graph = R.Graph(name="ravdl loop", seed=9, strategy=strategy)
    model = Net(dropout)
    for epoch in range(epochs):
        if lr_per_epoch:
            model.optimizer.hyper["lr"] = 0.01 / (epoch + 1)
        for b, (X_batch, y_batch) in enumerate(batch_iterator(X[:64], Y[:64], batch_size=8)):
            loss = R.square_loss(R.t(y_batch), model._forward_pass(R.t(X_batch)))
            model._backward_pass(loss)
            loss.persist_op(f"loss_{epoch}_{b}")
    model._forward_pass(R.t(X[64:96]), training=False).persist_op("prediction")
    return graph


def run_all(graph):
    R.activate()
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    return {name: R.fetch_persisting_op(name) for name in [*graph.persisted, *graph.step_outputs]}


@pytest.mark.parametrize("lr_per_epoch", [False, True])
def test_one_replica_gives_the_folded_loops_bits(lr_per_epoch, engine, workers):
    """LocalSGD of one replica averages nothing: a ravdl model's loop (BatchNorm statistics as buffers, Adam's
    moments as optimizer state) spliced into a replica's loop gives the bits of the loop compiled without it; with a
    learning rate per epoch each epoch's loop is replicated, the next one reading the previous one's model."""
    workers.start(1)
    graph = ravdl_loop(R.parallel.LocalSGD(1, sync_every=3), epochs=3, lr_per_epoch=lr_per_epoch)
    assert compile_planned(graph).summary["loops_replicated"] == (3 if lr_per_epoch else 1)
    got = run_all(graph)
    want = run_all(ravdl_loop(None, epochs=3, lr_per_epoch=lr_per_epoch))
    assert set(got) == set(want) and len(want) == 25
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_replicas_of_a_loop_with_dropout_give_the_same_bits_on_one_worker_or_two(engine, workers):
    """Resident replicas take turns on one worker and run side by side on two: the same numbers (each replica's
    dropout draws the streams of the steps it runs; BatchNorm statistics are averaged at every outer step)."""
    strategy = R.parallel.DiLoCo(2, inner_steps=3, compression="int8")
    names = workers.start(1)
    one = run_all(ravdl_loop(strategy, dropout=True))
    workers.start(1)
    two = run_all(ravdl_loop(strategy, dropout=True))
    assert names and set(one) == set(two)
    for name, value in one.items():
        assert torch.isfinite(value).all() and torch.equal(two[name], value), name


def folded_template(graph):
    ir, _ = run_pipeline(ir_module.from_graph(graph), PIPELINE[:3])   # dead code, CSE, folding
    (record,) = ir.loops.values()
    return record.spec.templates[0]


def test_the_replicated_model_is_read_off_the_folded_step():
    """A ravdl model's Adam: parameters and their two moments; BatchNorm's running statistics: buffers. A raw
    update `w - lr * g`: a parameter."""
    kinds = carried_kinds(folded_template(ravdl_loop(None)))
    assert [kinds.count(kind) for kind in ("parameter", "buffer", "optimizer state")] == [6, 2, 12]
    graph = R.Graph(name="sgd")
    w = R.t(torch.tensor([1.0, -2.0]))
    for s in range(8):
        loss = R.mean((R.matmul(R.t(X[s * 8:(s + 1) * 8, :2]), w) - R.t(Y[s * 8:(s + 1) * 8, 0])) ** 2)
        w = w - 0.1 * R.grad(loss, [w])[0]
    w.persist_op("w")
    assert carried_kinds(folded_template(graph)) == ["parameter"]
