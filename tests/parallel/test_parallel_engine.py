"""R.parallel's strategies on the engine (a real server, worker processes): the replicas of a synchronisation
interval run on distinct workers, the numbers are the in-process numbers bit for bit whatever worker ran what,
a replica whose worker dies resumes from its loop checkpoint with the same bits, the saved model is the
replicas' average, and R.activate()'s summary shows the placement from the workers' advertised capabilities."""
import numpy as np
import pytest
import torch

import ravop as R
from helpers import on_one_thread, wait_for
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.runtime.evaluate import evaluate_persisted
from ravop.store import GraphKeys
from ravop.store import graphs as store_graphs
from ravop.store import worker_info
from test_loop_workers import checkpoint_of

RNG = np.random.default_rng(4)
X = RNG.normal(size=(48, 6)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[RNG.integers(0, 3, 48)]


def record(strategy, epochs, batch_size, name="parallel"):
    graph = R.Graph(name=name, seed=9)
    model = NeuralNetwork(Adam(lr=0.02), loss="SquareLoss")
    for layer in (Dense(16, input_shape=(6,)), Activation("relu"), Dense(3)):
        model.add(layer)
    names = list(model.fit(X, Y, n_epochs=epochs, batch_size=batch_size, strategy=strategy))
    model.predict(X).persist_op("prediction")
    model.save_model("trained")
    return graph, names + ["prediction"]


def run_on_both(engine, client, graph, workers):
    """Run the activated graph; assert both `workers` ran some of its subgraphs."""
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    ran = client.hgetall(GraphKeys(engine.token, graph.id).ran)
    assert {worker.decode() for worker in ran.values()} == set(workers)


def assert_same_as_in_process(graph, names):
    want = on_one_thread(evaluate_persisted, graph, names)
    for name in names:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name


def assert_saved_model_predicts():
    module = R.fetch_persisting_op("trained")
    assert isinstance(module, torch.nn.Module)
    with torch.no_grad():
        assert torch.allclose(module(torch.as_tensor(X)), R.fetch_persisting_op("prediction"), atol=1e-6)


def test_local_sgd_replicas_run_on_distinct_workers_with_in_process_bits(engine, workers, client):
    names = workers.start(2)
    advertised = {w["name"]: w for w in worker_info.read_all(client)}
    assert all(advertised[n]["handoff_bytes_per_s"] > 0 and advertised[n]["threads"] == 1 for n in names)
    graph, persisted = record(R.parallel.LocalSGD(replicas=2, sync_every=3), epochs=4, batch_size=4)
    summary = R.activate()
    assert set(summary["placement"]["LocalSGD(replicas=2, sync_every=3, average_optim=False)"].values()) == set(names)
    assert "replica 1 on" in str(summary)
    run_on_both(engine, client, graph, names)
    assert_same_as_in_process(graph, persisted)
    assert_saved_model_predicts()


def test_data_parallel_and_gossip_on_two_workers_give_the_in_process_bits(engine, workers, client):
    names = workers.start(2)
    graph, persisted = record(R.parallel.DataParallel(replicas=2), epochs=2, batch_size=12, name="dp")
    R.activate()
    run_on_both(engine, client, graph, names)
    assert_same_as_in_process(graph, persisted)
    graph, persisted = record(R.parallel.Gossip(replicas=4, interpolation="loss"), epochs=6, batch_size=4,
                              name="gossip")
    R.activate()
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    assert_same_as_in_process(graph, persisted)
    losses = R.fetch_losses().per_epoch()
    assert losses[-1] < losses[0]   # it learns


def test_pipeline_stages_run_on_both_workers_with_the_in_process_bits(engine, workers, client):
    names = workers.start(2)
    graph, persisted = record(R.parallel.Pipeline(stages=2, micro_batches=3), epochs=2, batch_size=12, name="gpipe")
    assert "stage 1 on" in str(R.activate())
    run_on_both(engine, client, graph, names)
    assert_same_as_in_process(graph, persisted)
    assert_saved_model_predicts()


def test_replicated_pipeline_runs_on_both_workers_with_the_in_process_bits(engine, workers, client):
    names = workers.start(2)
    strategy = R.parallel.Pipeline(stages=2, micro_batches=2, replicas=2)
    graph, persisted = record(strategy, epochs=1, batch_size=12, name="clusters")
    assert "replica 1 stage 1 on" in str(R.activate())
    run_on_both(engine, client, graph, names)
    assert_same_as_in_process(graph, persisted)


def test_auto_stages_are_sized_by_the_live_workers_memory(engine, workers, client):
    with pytest.raises(R.GraphStateError, match="advertised memory of the cpu workers, and no live one advertises any"):
        record(R.parallel.Pipeline(stages="auto", micro_batches=2), epochs=1, batch_size=12, name="auto")
    names = workers.start(2)
    graph, persisted = record(R.parallel.Pipeline(stages="auto", micro_batches=2), epochs=1, batch_size=12,
                              name="auto")
    summary = R.activate()
    assert "Pipeline(stages=1, micro_batches=2)" in str(summary)   # the MLP fits a default worker's limit
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    assert_same_as_in_process(graph, persisted)
    assert {w["name"] for w in worker_info.read_all(client)} >= set(names)


def test_a_replica_whose_worker_dies_resumes_from_its_checkpoint_with_the_same_bits(engine, workers, client):
    names = workers.start(2, reclaim_idle=1.0, extra=("--checkpoint-steps", "20"))
    # shards of 24 rows in batches of 2: 12 steps an epoch, 600 a replica, averaged once half way
    graph, persisted = record(R.parallel.LocalSGD(replicas=2, sync_every=300), epochs=50, batch_size=2, name="kill")
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    loop_id, _ = wait_for(lambda: checkpoint_of(client, keys), "a segment's checkpoint")
    holder = client.hget(keys.taken, loop_id).decode()
    workers.kill(holder)
    assert store_graphs.steps_done(client, keys) < 1200, "the training ended before the kill: make it longer"
    R.track_progress(timeout=300, progress_bar=False)
    assert client.hget(keys.ran, loop_id).decode() == next(n for n in names if n != holder)
    assert_same_as_in_process(graph, persisted)
