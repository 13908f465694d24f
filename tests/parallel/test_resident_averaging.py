"""Resident LocalSGD and Gossip replicas (ravop/parallel/resident_averaging.py): one loop per replica for the
whole fit, exchanging only what the algorithm averages. They give the bits of the segment recording (which the
eager PyTorch references of test_parallel_math check), in-process and on a real server with worker processes,
their plan does not grow with the number of synchronisations, and the bytes a round moves are measured on the
server."""
import pytest
import torch

from compiler.compile import compile_graph
import ravop as R
from helpers import on_one_thread
from ravop.runtime.evaluate import evaluate_persisted
from ravop.store import GraphKeys
from test_diloco import PARAM_NAMES
from test_parallel_math import X, Y, gossip_reference, ravdl_net, torch_net
from test_resident_replicas import mlp_fit, server_bytes
from test_strategies_any_model import bn_net, pytorch_model


def fit_values(strategy, n_epochs, batch_size, shuffle=True):
    """(graph, names, values by name) of `strategy`'s fit of the test MLP, in-process."""
    graph = R.Graph(name="resident averaging", seed=11)
    model = ravdl_net(torch_net())
    names = list(model.fit(X, Y, n_epochs=n_epochs, batch_size=batch_size, shuffle=shuffle, seed=3,
                           strategy=strategy))
    persisted = names + PARAM_NAMES + ["prediction"]
    model.persist_weights()
    model.predict(X).persist_op("prediction")
    return graph, persisted, evaluate_persisted(graph)


def assert_same_bits(make, n_epochs=2, batch_size=5, shuffle=True):
    _, names, resident = fit_values(make(True), n_epochs, batch_size, shuffle)
    _, segment_names, segments = fit_values(make(False), n_epochs, batch_size, shuffle)
    assert names == segment_names
    for name in names:
        assert torch.equal(resident[name], segments[name]), name
    return resident


@pytest.mark.parametrize("replicas, sync_every, average_optim", [(2, 3, False), (3, 2, True), (2, 1, False)])
def test_resident_local_sgd_gives_the_bits_of_segments(replicas, sync_every, average_optim):
    values = assert_same_bits(lambda resident: R.parallel.LocalSGD(replicas, sync_every, average_optim,
                                                                   resident=resident))
    initial = torch_net()[0].weight.detach()
    assert (values["Dense_1.weight"] - initial).abs().max() > 1e-3   # it trained


@pytest.mark.parametrize("replicas, interpolation, factor, threshold",
                         [(2, "constant", 0.3, 0.0), (3, "clock", 0.5, 0.0), (4, "loss", 0.5, 0.9)])
def test_resident_gossip_gives_the_bits_of_segments_and_matches_eager_pytorch(replicas, interpolation, factor,
                                                                             threshold):
    def make(resident):
        return R.parallel.Gossip(replicas, interpolation=interpolation, factor=factor,
                                 divergence_threshold=threshold, resident=resident)
    # 48 rows: shards of 12 (replicas 4) or 16 (3) or 24 (2) rows
    values = assert_same_bits(make, n_epochs=1, batch_size=4, shuffle=False)
    losses = gossip_reference(make(True), 1, 4, graph_seed=11)
    for r in range(replicas):
        for b, loss in enumerate(losses[r]):
            assert torch.allclose(values[f"training_loss_epoch_1_batch_{b * replicas + r + 1}"], loss, atol=1e-5)


@pytest.mark.parametrize("make", [lambda resident: R.parallel.LocalSGD(2, 3, resident=resident),
                                  lambda resident: R.parallel.Gossip(2, interpolation="loss", resident=resident),
                                  lambda resident: R.parallel.DiLoCo(2, 3, compression="int8", overlap=True,
                                                                     resident=resident)],
                         ids=["LocalSGD", "Gossip", "DiLoCo-overlap"])
def test_a_pytorch_models_batch_norm_statistics_and_counters_as_in_segments(make):
    values = []
    for resident in (True, False):
        graph = R.Graph(name="resident batch norm", seed=5)
        model = pytorch_model(bn_net)
        model.fit(X, Y, 2, 6, loss="SquareLoss", shuffle=True, seed=1, strategy=make(resident))
        for k, op in enumerate(model.buffers):
            op.persist_op(f"buffer {k}")
        model._forward_pass(R.t(X), training=False).persist_op("prediction")
        got = evaluate_persisted(graph)
        values.append([got[f"buffer {k}"] for k in range(len(model.buffers))] + [got["prediction"]])
    assert values[0][-2].dtype == torch.int64 and int(values[0][-2]) == 2 * 4
    for got, want in zip(*values):
        assert torch.equal(got, want)


def plan_nodes(strategy):
    graph = R.Graph(name="folded", seed=11)
    model = ravdl_net(torch_net())
    model.fit(X, Y, n_epochs=4, batch_size=6, strategy=strategy)
    model.persist_weights()
    plan = compile_graph(graph).plan
    return sum(len(s.nodes.id) + sum(len(t.nodes.id) for t in s.loop.templates) for s in plan.subgraphs)


def test_resident_plans_do_not_grow_with_the_number_of_synchronisations():
    # 24 rows per replica in batches of 6: 16 steps
    assert plan_nodes(R.parallel.LocalSGD(2, 8, resident=True)) == plan_nodes(R.parallel.LocalSGD(2, 1, resident=True))
    assert plan_nodes(R.parallel.Gossip(2, resident=True)) < plan_nodes(R.parallel.Gossip(2, resident=False)) / 4


def test_resident_knob_is_checked():
    for make in (lambda: R.parallel.LocalSGD(2, 3, resident="yes"), lambda: R.parallel.Gossip(2, resident=1)):
        with pytest.raises(TypeError, match="resident"):
            make()
    assert "resident=True" in repr(R.parallel.LocalSGD(2, 3, resident=True))
    assert "resident=False" in repr(R.parallel.Gossip(2, resident=False))


@pytest.mark.parametrize("kind", ["LocalSGD", "Gossip"])
def test_bytes_per_synchronisation_are_one_model_up_and_one_down(engine, workers, client, kind):
    # checkpoints off: this measures what the algorithm exchanges (a checkpoint is the fallback, priced apart)
    workers.start(2, extra=("--checkpoint-steps", "1000000", "--checkpoint-seconds", "100000",
                            "--resident-checkpoint-seconds", "100000"))
    rows = 2 * 32 * 8   # per replica 8 steps of 32 rows an epoch
    strategy = R.parallel.LocalSGD(2, sync_every=4, resident=True) if kind == "LocalSGD" else \
        R.parallel.Gossip(2, resident=True)
    syncs_per_epoch = 2 if kind == "LocalSGD" else 8
    totals = []
    for n_epochs in (1, 3):
        before = server_bytes(client)
        model_bytes = 4 * mlp_fit(f"bytes {kind} {n_epochs}", rows, n_epochs, strategy)   # float32
        totals.append(server_bytes(client) - before)
    per_sync_per_replica = (totals[1] - totals[0]) / ((3 - 1) * syncs_per_epoch) / 2
    print(f"{kind}: {per_sync_per_replica:.0f} bytes per synchronisation per replica, "
          f"{per_sync_per_replica / model_bytes:.2f}x the float32 model ({model_bytes} bytes); run totals {totals}")
    # a replica r > 0 (LocalSGD) sends one model and receives one; replica 0 receives one and sends one;
    # Gossip of two sends one and receives one: on the server's counters 2 models in + 2 out per pair of replicas
    assert per_sync_per_replica <= 2.3 * model_bytes


def test_resident_local_sgd_and_gossip_run_on_distinct_workers_with_the_in_process_bits(engine, workers, client):
    names = workers.start(2)
    for strategy in (R.parallel.LocalSGD(2, 3, resident=True),
                     R.parallel.Gossip(2, interpolation="loss", resident=True)):
        graph = R.Graph(name=f"resident {strategy!r}"[:60], seed=11)
        model = ravdl_net(torch_net())
        history = model.fit(X, Y, n_epochs=3, batch_size=6, shuffle=True, seed=3, strategy=strategy)
        persisted = list(history)
        model.persist_weights()
        model.predict(X).persist_op("prediction")
        persisted += PARAM_NAMES + ["prediction"]
        R.activate()
        R.execute()
        R.track_progress(timeout=300, progress_bar=False)
        keys = GraphKeys(engine.token, graph.id)
        loops = [s for s in client.hkeys(keys.ran) if client.hget(keys.ran, s)]
        assert {client.hget(keys.ran, s).decode() for s in loops} == set(names)
        held = history.placement[repr(strategy)]   # the workers that ran them, as the engine recorded
        assert sorted(held) == ["replica 0", "replica 1"] and all(len(workers) == 1 for workers in held.values())
        assert {workers[0] for workers in held.values()} == set(names)
        want = on_one_thread(evaluate_persisted, graph, persisted)
        for name in persisted:
            assert torch.equal(R.fetch_persisting_op(name), want[name]), name
