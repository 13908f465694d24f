"""A loop on the workers follows the rules of any subgraph (worker/loops/loop_subgraph.py): checkpoints go through the
chunked tensor store and resume from there, a worker told to stop checkpoints and hands the loop back, the
templates' declared sizes meet the worker's memory limit, and their creation and random ops run on the
worker's device."""
import re

import numpy as np
import pytest
import torch

import ravop as R
from helpers import on_one_thread, wait_for
from pretend_device import on_device, pretend_device
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense, Dropout
from ravdl.v2.optimizers import Adam
from ravop.core.errors import GraphFailedError
from ravop.record.loop import Loop
from ravop.runtime.evaluate import evaluate, evaluate_persisted
from ravop.store import GraphKeys
from ravop.store import graphs as store_graphs
from ravop.store.tensors import chunks_key

RNG = np.random.default_rng(2)
X = RNG.normal(size=(40, 4))
Y = np.eye(3)[RNG.integers(0, 3, 40)]
CHECKPOINT = re.compile(rb":ckpt:(\d+)$")


def record_fit(name, epochs):
    """A fit whose second weight (32 x 64 float32, 8 KiB) spans several 1 KiB chunks."""
    graph = R.Graph(name=name, seed=6)
    m = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    for layer in (Dense(64, input_shape=(4,)), Activation("relu"), Dropout(0.1), Dense(32), Activation("relu"),
                  Dense(3)):
        m.add(layer)
    names = list(m.fit(X, Y, n_epochs=epochs, batch_size=8, shuffle=True))
    m.predict(X).persist_op("prediction")
    return graph, names + ["prediction"]


def checkpoint_of(client, keys):
    """(loop subgraph id, step) of the graph's checkpoint, or None."""
    for key in client.keys(keys.prefix + "ckpt:*"):
        found = CHECKPOINT.search(key)
        if found and client.hexists(key, "step"):
            return int(found.group(1)), int(client.hget(key, "step"))
    return None


def chunks_of_a_steady_checkpoint(client, keys):
    """(loop subgraph id, chunk counts of its checkpoint's tensors), or None while there is none or a newer one replaced it mid-read
    (the worker drops a checkpoint's tensors once the next is written)."""
    before = checkpoint_of(client, keys)
    if before is None:
        return None
    loop_id, step = before
    record = keys.checkpoint(loop_id)
    counts = [client.hlen(chunks_key(f"{record}:{step}:{k}")) for k in range(int(client.hget(record, "n") or 0))]
    return (loop_id, counts) if counts and checkpoint_of(client, keys) == before else None


def assert_same_as_in_process(graph, names):
    want = on_one_thread(evaluate_persisted, graph, names)
    for name in names:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name


def test_a_checkpoint_in_chunks_resumes_on_another_worker_with_the_same_bits(engine, workers, client, monkeypatch):
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", "1024")   # the workers inherit it
    names = workers.start(2, reclaim_idle=1.0, extra=("--checkpoint-steps", "25"))
    graph, persisted = record_fit("chunked checkpoint", epochs=300)
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    loop_id, chunk_counts = wait_for(lambda: chunks_of_a_steady_checkpoint(client, keys), "a checkpoint")
    assert max(chunk_counts) >= 8   # the 32 x 64 weight and its Adam moments, in 1 KiB chunks
    holder = client.hget(keys.taken, loop_id).decode()
    workers.kill(holder)
    assert store_graphs.steps_done(client, keys) < 300 * 5, "the loop ended before the kill: make it longer"
    R.track_progress(timeout=300, progress_bar=False)
    assert client.hget(keys.ran, loop_id).decode() == next(n for n in names if n != holder)
    assert_same_as_in_process(graph, persisted)
    assert not client.exists(keys.checkpoint(loop_id))   # the finished loop dropped its checkpoint record
    # Chunks of a checkpoint the killed worker was writing when it died go when the next worker resumes
    # (tests/worker/loops/test_checkpoint_link.py); those of one it wrote after a takeover on a loaded machine are named by no
    # record: they stay until the graph is flushed, then go.
    R.flush()
    assert not client.keys(keys.prefix + "*")


def test_a_worker_told_to_stop_checkpoints_and_hands_its_loop_back(engine, workers, client):
    # No takeover: the others would wait 1000 s to call the stopped worker dead, so only a hand-back is quick.
    names = workers.start(2, reclaim_idle=1000.0, extra=("--dead-after", "1000", "--checkpoint-steps", "100000",
                                                         "--checkpoint-seconds", "1000"))
    graph, persisted = record_fit("sigterm", epochs=2000)
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    wait_for(lambda: store_graphs.steps_done(client, keys) > 0, "the loop's first steps")
    loop_id = next(int(s) for s in client.hkeys(keys.taken))
    holder = client.hget(keys.taken, loop_id).decode()
    assert workers.terminate(holder) == 0
    total = 2000 * 5
    handed_back_at = checkpoint_of(client, keys)
    assert handed_back_at is not None and handed_back_at[1] < total   # it stopped mid-loop, with a checkpoint
    R.track_progress(timeout=300, progress_bar=False)
    assert client.hget(keys.ran, loop_id).decode() == next(n for n in names if n != holder)
    assert_same_as_in_process(graph, persisted)


def test_a_loop_template_over_the_workers_memory_limit_is_refused_naming_its_op(engine, workers):
    workers.start(1, extra=("--max-subgraph-bytes", str(2**20)))
    R.Graph(name="big step")
    total = R.t(torch.zeros(()))
    loop = Loop([total])
    with loop.step() as step:
        big = R.zeros(shape=(1024, 1024))   # 4 MiB, declared: over the 1 MiB limit
        step.carry([step.carried[0] + big.sum()])
    final, = loop.run([(0, 3)])
    final.persist_op("total")
    R.activate()
    R.execute()
    with pytest.raises(GraphFailedError, match=r"'zeros'.*1 MiB"):
        R.track_progress(timeout=120, progress_bar=False)


def test_creation_and_random_ops_of_a_step_run_on_the_workers_device():
    R.Graph(name="device loop", seed=4)
    x = R.t(torch.ones(6))
    loop = Loop([x])
    with loop.step() as step:
        value = step.carried[0]
        noise = R.dropout(R.zeros(shape=(6,)) + 1.0, p=0.5, training=True)   # creation and random ops
        new = value + noise + R.arange(start=0, stop=6, dtype="float32")
        step.persist(noise, ["noise_1", "noise_2"])
        step.carry([new])
    final, = loop.run([(0, 2)])
    want = evaluate([final])
    with pretend_device() as device:
        got = evaluate([final], device=device)
    assert on_device(got[0])
    assert torch.equal(got[0].cpu(), want[0])
