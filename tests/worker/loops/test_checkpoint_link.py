"""A loop whose checkpoints go up a slow link (each of its workers' connections throttled on the way to the
store: tests/throttled_link.py) is not held up by them (worker/loops/checkpoint_cadence.py): the checkpoint asked
for every 5 steps waits while the last is being written and then takes the state of its own step, so the
checkpoints land many steps apart, where a queue of copies behind the link held the loop to its pace. A worker
SIGKILLed while a checkpoint is in flight is replaced by one that resumes from the last complete checkpoint with
the same bits and deletes the chunks the dead one left half-written. Real workers, a real server."""
import numpy as np
import pytest

import ravop as R
from conftest import Workers
from helpers import wait_for
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.store import GraphKeys
from ravop.store import graphs as store_graphs
from test_loop_workers import assert_same_as_in_process
from throttled_link import ThrottledLink

RATE = 2e6          # bytes/s up each worker connection: a checkpoint (~0.8 MB) takes ~0.4 s
ASKED = 5           # --checkpoint-steps
RNG = np.random.default_rng(3)
X = RNG.normal(size=(40, 4))
Y = np.eye(3)[RNG.integers(0, 3, 40)]


def record_fit(epochs):
    """An MLP of 67k parameters: 0.8 MB of state with Adam's moments."""
    graph = R.Graph(name="slow link checkpoints", seed=8)
    m = NeuralNetwork(Adam(lr=0.001), loss="SquareLoss")
    for layer in (Dense(256, input_shape=(4,)), Activation("relu"), Dense(256), Activation("relu"), Dense(3)):
        m.add(layer)
    names = list(m.fit(X, Y, n_epochs=epochs, batch_size=8, shuffle=True))
    return graph, names


@pytest.fixture
def slow_workers(server, tmp_path, monkeypatch):
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", "65536")   # the workers inherit it: checkpoints go in chunks
    link = ThrottledLink(server.socket, RATE)
    pool = Workers(link.url, tmp_path)
    yield pool
    pool.stop_all()
    link.close()


def test_checkpoints_over_a_slow_link_coalesce_and_a_kill_mid_write_resumes_with_the_same_bits(engine, slow_workers,
                                                                                              client):
    slow_workers.start(2, reclaim_idle=1.0, extra=("--checkpoint-steps", str(ASKED)))
    graph, persisted = record_fit(epochs=1500)   # 7,500 steps
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    loop_id = int(wait_for(lambda: next(iter(client.hkeys(keys.taken)), None), "the loop's claim"))
    record = keys.checkpoint(loop_id)
    published = []

    def three_checkpoints():
        assert not client.sismember(keys.done, loop_id), "the loop ended before three checkpoints: make it longer"
        step = client.hget(record, "step")
        if step is not None and (not published or published[-1] != int(step)):
            published.append(int(step))
        return len(published) >= 3 or None
    wait_for(three_checkpoints, "three checkpoints", timeout=180)
    # the loop went on while each was written (a queue behind the link held it to a checkpoint every 5 steps)
    assert (np.diff(published) > 10 * ASKED).all(), published

    def in_flight():   # a checkpoint's chunks partly up, the last complete one published
        assert not client.sismember(keys.done, loop_id), "the loop ended before a kill mid-write: make it longer"
        writing, step = client.get(keys.checkpoint_writing(loop_id)), client.hget(record, "step")
        return (int(writing), int(step)) if writing is not None and step is not None and writing != step else None
    writing, step = wait_for(in_flight, "a checkpoint in flight")
    holder = client.hget(keys.taken, loop_id).decode()
    slow_workers.kill(holder)
    assert client.hget(record, "step") in (str(step).encode(), str(writing).encode())
    assert store_graphs.steps_done(client, keys) < 7500
    R.track_progress(timeout=300, progress_bar=False)
    assert client.hget(keys.ran, loop_id).decode() != holder
    assert_same_as_in_process(graph, persisted)
    # the half-written chunks went when the loop resumed, the rest with the finished loop: nothing before a flush
    assert not client.keys(f"{record}*")
