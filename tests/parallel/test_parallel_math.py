"""R.parallel's strategies (ravdl/v2/parallel_fit.py) compute what eager PyTorch computes for the same algorithm
on a small MLP: LocalSGD (replicas on shards, averaged every sync_every steps), DataParallel (the losses of
one-worker training), Gossip (seeded pairs, dpwa's interpolations). Run in-process (ravop.runtime.evaluate); the
engine runs of tests/parallel/test_parallel_engine.py check the same plans across worker processes."""
import copy

import numpy as np
import pytest
import torch

from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.core.errors import GraphStateError
from ravop.record.loop import Batches, Loop
from ravop.runtime.evaluate import evaluate_persisted

RNG = np.random.default_rng(0)
X = RNG.normal(size=(48, 5)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[RNG.integers(0, 3, 48)]
LR = 0.02


def torch_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def ravdl_net(net):
    """The same MLP in ravdl, from `net`'s initial weights."""
    model = NeuralNetwork(Adam(lr=LR), loss="SquareLoss")
    first, last = net[0], net[2]
    model.add(Dense(8, initial_W=first.weight.detach().numpy(), initial_w0=first.bias.detach().numpy(),
                    input_shape=(5,)))
    model.add(Activation("tanh"))
    model.add(Dense(3, initial_W=last.weight.detach().numpy(), initial_w0=last.bias.detach().numpy()))
    return model


def fit(strategy, n_epochs, batch_size, shuffle=False, seed=3):
    """(loss by name, final prediction on X) of `strategy`'s fit, computed in-process."""
    graph = R.Graph(name="parallel", seed=11)
    model = ravdl_net(torch_net())
    names = model.fit(X, Y, n_epochs=n_epochs, batch_size=batch_size, shuffle=shuffle, seed=seed, strategy=strategy)
    model.predict(X).persist_op("prediction")
    values = evaluate_persisted(graph)
    return {name: values[name] for name in names}, values["prediction"], list(names)


def batches_of(n_rows, batch_size, n_epochs, shuffle, seed):
    """Row indices of each batch, as ravop.record.loop.Batches visits them."""
    rng = np.random.default_rng(seed)
    for _ in range(n_epochs):
        order = rng.permutation(n_rows) if shuffle else np.arange(n_rows)
        for start in range(0, n_rows, batch_size):
            yield torch.as_tensor(order[start:start + batch_size])


def adam_step(net, opt, X_batch, y_batch):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(net(X_batch), y_batch)
    loss.backward()
    opt.step()
    return loss.detach()


def average_(modules):
    with torch.no_grad():
        for tensors in zip(*(m.parameters() for m in modules)):
            mean = tensors[0] + tensors[1] if len(tensors) == 2 else torch.stack(tensors).sum(0)
            mean = mean * (1.0 / len(tensors))
            for t in tensors:
                t.copy_(mean)


def average_adam_(opts):
    for states in zip(*(list(o.state.values()) for o in opts)):
        for key in ("exp_avg", "exp_avg_sq"):
            mean = (states[0][key] + states[1][key]) * 0.5
            for state in states:
                state[key].copy_(mean)


def local_sgd_reference(replicas, sync_every, n_epochs, batch_size, shuffle, seed, average_optim):
    net = torch_net()
    nets = [copy.deepcopy(net) for _ in range(replicas)]
    opts = [torch.optim.Adam(n.parameters(), lr=LR) for n in nets]
    size = len(X) // replicas
    shards = [(torch.as_tensor(X[r * size:(r + 1) * size]), torch.as_tensor(Y[r * size:(r + 1) * size]))
              for r in range(replicas)]
    plans = [list(batches_of(size, batch_size, n_epochs, shuffle, seed + r)) for r in range(replicas)]
    losses = [[] for _ in range(replicas)]
    for k in range(len(plans[0])):
        for r, (Xs, ys) in enumerate(shards):
            losses[r].append(adam_step(nets[r], opts[r], Xs[plans[r][k]], ys[plans[r][k]]))
        if (k + 1) % sync_every == 0 or k + 1 == len(plans[0]):
            average_(nets)
            if average_optim:
                average_adam_(opts)
    return losses, nets[0](torch.as_tensor(X)).detach()


@pytest.mark.parametrize("average_optim", [False, True])
def test_local_sgd_equals_eager_pytorch_of_the_same_algorithm(average_optim):
    epochs, batch, every = 2, 5, 3   # shards of 24 rows: 4 batches of 5 and one of 4 per epoch
    got, prediction, names = fit(R.parallel.LocalSGD(replicas=2, sync_every=every, average_optim=average_optim),
                                 epochs, batch, shuffle=True)
    losses, want_prediction = local_sgd_reference(2, every, epochs, batch, True, 3, average_optim)
    per_epoch = len(losses[0]) // epochs
    for r in range(2):
        for k, loss in enumerate(losses[r]):
            e, b = divmod(k, per_epoch)
            assert torch.allclose(got[f"training_loss_epoch_{e + 1}_batch_{b * 2 + r + 1}"], loss, atol=1e-6)
    assert len(names) == 2 * len(losses[0])
    assert torch.allclose(prediction, want_prediction, atol=1e-6)


def assert_one_worker_mathematics(strategy, epochs, batch, shuffle=False, atol=1e-5):
    """`strategy`'s fit gives one-worker eager Adam's losses and final prediction; returns the loss names."""
    got, prediction, names = fit(strategy, epochs, batch, shuffle=shuffle)
    net = torch_net()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    want = [adam_step(net, opt, torch.as_tensor(X)[rows], torch.as_tensor(Y)[rows])
            for rows in batches_of(len(X), batch, epochs, shuffle, 3)]
    assert torch.allclose(torch.stack([got[n] for n in names]), torch.stack(want), atol=atol)
    assert torch.allclose(prediction, net(torch.as_tensor(X)).detach(), atol=atol)
    return names


def test_data_parallel_losses_equal_one_worker_training():
    # 48 rows: 4 batches of 10 and one of 8, cut 5/5 and 4/4
    names = assert_one_worker_mathematics(R.parallel.DataParallel(replicas=2), 2, 10, shuffle=True, atol=1e-4)
    assert names == [f"training_loss_epoch_{e}_batch_{b}" for e in (1, 2) for b in range(1, 6)]


def test_data_parallel_of_three_replicas_cuts_uneven_batches():
    assert_one_worker_mathematics(R.parallel.DataParallel(replicas=3), 1, 16)   # 16 rows: 6/5/5


def test_pipeline_losses_equal_one_worker_training():
    # batches of 10 in 3 micro-batches (4/3/3), the short one of 8 in 3/3/2
    assert_one_worker_mathematics(R.parallel.Pipeline(stages=2, micro_batches=3), 2, 10, shuffle=True)


def test_replicated_pipeline_losses_equal_one_worker_training():
    # batches of 10: replica slices 5/5, each in micro-batches 3/2; the short one of 8: 4/4, each 2/2
    strategy = R.parallel.Pipeline(stages=2, micro_batches=2, replicas=2)
    assert strategy.micro_slices(10) == [(0, 3), (3, 5), (5, 8), (8, 10)]
    assert_one_worker_mathematics(strategy, 1, 10)
    assert list(R.parallel.forecast(strategy, [{"name": "a", "kind": "cpu"}, {"name": "b", "kind": "cpu"}], "cpu")) == [
        "replica 0 stage 0", "replica 0 stage 1", "replica 1 stage 0", "replica 1 stage 1"]


def test_pipeline_stages_balance_their_cost():
    assert R.parallel.Pipeline(stages=2).cut([48, 1, 27]) == [(0, 1), (1, 3)]
    assert R.parallel.Pipeline(stages=3).cut([5, 5, 5, 5, 10]) == [(0, 2), (2, 4), (4, 5)]


def gossip_reference(strategy, n_epochs, batch_size, graph_seed, seed=3):
    net = torch_net()
    replicas = strategy.replicas
    nets = [copy.deepcopy(net) for _ in range(replicas)]
    opts = [torch.optim.Adam(n.parameters(), lr=LR) for n in nets]
    size = len(X) // replicas
    shards = [(torch.as_tensor(X[r * size:(r + 1) * size]), torch.as_tensor(Y[r * size:(r + 1) * size]))
              for r in range(replicas)]
    plan = list(batches_of(size, batch_size, n_epochs, False, seed))
    losses = [[] for _ in range(replicas)]
    for k, rows in enumerate(plan):
        last = [adam_step(nets[r], opts[r], Xs[rows], ys[rows]) for r, (Xs, ys) in enumerate(shards)]
        for r in range(replicas):
            losses[r].append(last[r])
        before = [[p.detach().clone() for p in n.parameters()] for n in nets]
        for i, j in strategy.pairs(k + 1, graph_seed):
            for me, peer in ((i, j), (j, i)):
                if strategy.interpolation == "loss":
                    a = last[me] / (last[me] + last[peer])
                else:
                    a = strategy.factor if strategy.interpolation == "constant" else 0.5
                if strategy.divergence_threshold > 0:
                    a = float(last[me] >= strategy.divergence_threshold) * a
                with torch.no_grad():
                    for p, own, other in zip(nets[me].parameters(), before[me], before[peer]):
                        p.copy_(own + (other - own) * a)
    return losses


@pytest.mark.parametrize("interpolation, factor, threshold", [("constant", 0.3, 0.0), ("clock", 0.5, 0.0),
                                                              ("loss", 0.5, 0.9)])
def test_gossip_equals_eager_pytorch_with_seeded_pairs(interpolation, factor, threshold):
    strategy = R.parallel.Gossip(replicas=4, interpolation=interpolation, factor=factor,
                                 divergence_threshold=threshold)
    got, _, _ = fit(strategy, 1, 4, shuffle=False)
    losses = gossip_reference(strategy, 1, 4, graph_seed=11)
    for r in range(4):
        for b, loss in enumerate(losses[r]):
            assert torch.allclose(got[f"training_loss_epoch_1_batch_{b * 4 + r + 1}"], loss, atol=1e-5)


def test_gossip_pairs_are_seeded():
    strategy = R.parallel.Gossip(replicas=4)
    assert strategy.pairs(3, 11) == strategy.pairs(3, 11)
    assert len({tuple(strategy.pairs(k, 11)) for k in range(20)}) > 1
    assert sorted(i for pair in strategy.pairs(3, 11) for i in pair) == [0, 1, 2, 3]


def test_every_strategy_has_the_hooks_its_recording_calls():
    """ravop/parallel/protocol.py declares every hook: each strategy has the Strategy hooks and those of the recording
    its record_fit picks; one that lacks a hook is refused with the hook's name."""
    from ravop.parallel.protocol import GradientReplicas, PipelineStages, ShardReplicas, check_hooks, check_strategy
    P = R.parallel
    for strategy, recording in [(P.DataParallel(2), GradientReplicas), (P.LocalSGD(2, 2), ShardReplicas),
                                (P.Gossip(2), ShardReplicas), (P.DiLoCo(2, 2), ShardReplicas),
                                (P.Pipeline(2), PipelineStages)]:
        assert check_hooks(check_strategy(strategy), recording) is strategy

    class NoRoles:
        replicas = 2

        def record_fit(self, fit):
            return fit.replicated(self)
    with pytest.raises(TypeError, match=r"missing: roles\)"):
        check_strategy(NoRoles())
    with pytest.raises(TypeError, match="lacks the hook slices of GradientReplicas"):
        check_hooks(R.parallel.LocalSGD(2, 2), GradientReplicas)


def test_bad_strategies_are_refused_by_name(engine):
    with pytest.raises(ValueError, match="sync_every"):
        R.parallel.LocalSGD(replicas=2, sync_every=0)
    with pytest.raises(ValueError, match="replicas"):
        R.parallel.DataParallel(replicas=0)
    with pytest.raises(ValueError, match="interpolation"):
        R.parallel.Gossip(replicas=2, interpolation="random")
    with pytest.raises(ValueError, match="factor applies"):
        R.parallel.Gossip(replicas=2, interpolation="loss", factor=0.2)
    with pytest.raises(ValueError, match="positive int or 'auto'"):
        R.parallel.Pipeline(stages="two", micro_batches=4)
    with pytest.raises(ValueError, match="3 layers cannot make 4 stages"):
        R.parallel.Pipeline(stages=4).cut([1, 1, 1])
    with pytest.raises(TypeError, match="one of R.parallel's strategies"):
        R.Graph(name="bad", strategy="LocalSGD")
    R.Graph(name="shards")
    with pytest.raises(ValueError, match="equal shards"):
        ravdl_net(torch_net()).fit(X[:47], Y[:47], 1, 5, strategy=R.parallel.LocalSGD(2, 2))
    R.Graph(name="no fit", strategy=R.parallel.LocalSGD(2, 2))
    R.t([1.0]).persist_op("x")
    with pytest.raises(GraphStateError, match="no fit used it and no hand-written training loop folded"):
        R.activate()


def test_sync_every_shows_in_the_compiled_estimate_of_transfers():
    from compiler import compile_graph

    def handoff(every):
        graph = R.Graph(name=f"every {every}")
        ravdl_net(torch_net()).fit(X, Y, 2, 4, strategy=R.parallel.LocalSGD(2, every))
        return compile_graph(graph).summary["estimated_handoff_seconds"]

    assert handoff(2) > 2 * handoff(8) > 0


def test_a_segment_runs_its_steps_of_the_schedule_with_their_batches_and_random_streams():
    """Loop.run(segment=(first, n)): the steps [first, first + n) of the whole loop, the same bits."""
    def record(segment, names):
        data = R.t(torch.arange(12.0).reshape(6, 2))
        loop = Loop([R.t(torch.zeros(2))], Batches(6, 2, shuffle=True, seed=4))
        with loop.step() as step:
            noisy = step.rows(data, 2).sum(0) + R.dropout(R.t(torch.ones(2)), p=0.5, training=True)
            step.persist(noisy, names)
            step.carry([step.carried[0] + noisy])
        return loop.run([(0, 3)], rounds=2, segment=segment)

    graph = R.Graph(name="whole", seed=2)
    record(None, [f"s{k}" for k in range(6)])[0].persist_op("end")
    whole = evaluate_persisted(graph)
    graph = R.Graph(name="segment", seed=2)
    record((2, 3), [f"s{k}" for k in range(2, 5)])
    part = evaluate_persisted(graph)
    assert all(torch.equal(part[f"s{k}"], whole[f"s{k}"]) for k in range(2, 5))
    with pytest.raises(ValueError, match="not within the loop's 6 steps"):
        record((4, 3), ["a", "b", "c"])


def test_auto_stages_are_the_fewest_that_fit_the_workers_limit():
    auto = R.parallel.Pipeline(stages="auto", micro_batches=3)
    costs = [400, 100, 300, 300, 200]

    def fit_to(limit):   # one worker's limit, every boundary alike: the most even cut of the fewest stages
        return auto.fit_to_workers(costs, [1] * len(costs), [{"name": "w", "memory_limit": limit}])
    assert fit_to(1300).stages == 1
    chosen = fit_to(700)     # any two stages have one of at least 800
    assert (chosen.stages, chosen.micro_batches) == (3, 3)
    assert chosen.cut(costs) == [(0, 1), (1, 3), (3, 5)]
    assert fit_to(400).stages == 4   # [400] [100, 300] [300] [200]
    with pytest.raises(ValueError, match="a unit needs about 400 bytes"):
        fit_to(399)
    with pytest.raises(ValueError, match="no cut until"):
        auto.cut(costs)


def test_the_forecast_deals_roles_to_workers_of_the_graphs_device_kind_only():
    workers = [{"name": "gpu", "kind": "cuda", "handoff_bytes_per_s": 1e12},
               {"name": "slow", "kind": "cpu", "handoff_bytes_per_s": 1e6},
               {"name": "fast", "kind": "cpu", "handoff_bytes_per_s": 2e6}]
    strategy = R.parallel.LocalSGD(replicas=3, sync_every=2)
    assert R.parallel.forecast(strategy, workers, "cpu") == {"replica 0": "fast", "replica 1": "slow",
                                                             "replica 2": "fast"}
    assert set(R.parallel.forecast(strategy, workers, "cuda").values()) == {"gpu"}
    assert R.parallel.forecast(strategy, workers[:1], "cpu") == {}
    assert list(R.parallel.forecast(R.parallel.Pipeline(stages=2), workers, "cpu")) == ["stage 0", "stage 1"]
