"""A loop's first published checkpoint releases the initial values of what it carries from the server (issue 46:
nothing reads them after it; worker/loops/loop_subgraph.py, `superseded_inputs`), through the refs rule COMPLETE
uses: a takeover after that resumes from the checkpoint with the same bits, and the completion counts them once.
Under verify='spot' they stay (a segment re-run from the start reads them). The worker hands them to the loop
uncached, which trains them in place instead of copying them first (ravop/runtime/loop_run.py, `donated`)."""
import uuid

import numpy as np
import torch

import ravop as R
from helpers import on_one_thread, wait_for
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.runtime.evaluate import evaluate_persisted
from ravop.core.graph_states import DONE, FAILED
from ravop.runtime import loop_run
from ravop.store import GraphKeys, connect
from ravop.store import tensors as stored
from worker import Worker

RNG = np.random.default_rng(5)
X = RNG.normal(size=(40, 4))
Y = np.eye(3)[RNG.integers(0, 3, 40)]


def record_fit(name, epochs, **settings):
    graph = R.Graph(name=name, seed=3, **settings)
    m = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    for layer in (Dense(16, input_shape=(4,)), Activation("relu"), Dense(3)):
        m.add(layer)
    names = list(m.fit(X, Y, n_epochs=epochs, batch_size=8, shuffle=True))
    m.predict(X).persist_op("prediction")
    return graph, names + ["prediction"]


def early_released(client, keys):
    """{loop subgraph id: [input ids]} its checkpoint released ahead of its completion."""
    found = {}
    for field in client.hkeys(keys.refs):
        if field.startswith(b"early:"):
            _, sid, i = field.decode().split(":")
            found.setdefault(int(sid), []).append(int(i))
    return found


def present(client, keys, ids):
    return [i for i in ids if any(client.exists(key) for key in stored.keys_of(keys.tensor(i)))]


def test_the_first_checkpoint_releases_the_initial_values_and_a_takeover_resumes_with_the_same_bits(
        engine, workers, client):
    names = workers.start(2, reclaim_idle=1.0, extra=("--checkpoint-steps", "25"))
    graph, persisted = record_fit("superseded", epochs=400)
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    released = wait_for(lambda: early_released(client, keys) or None, "a checkpoint's release")
    (loop_id, ids), = released.items()
    assert len(ids) >= 4   # the two Dense layers' weights and biases
    assert not client.sismember(keys.done, loop_id), "the loop ended before the check: make it longer"
    assert client.hexists(keys.checkpoint(loop_id), "step")
    assert present(client, keys, ids) == []   # gone from the server while the loop runs
    holder = client.hget(keys.taken, loop_id).decode()
    workers.kill(holder)
    R.track_progress(timeout=300, progress_bar=False)
    assert client.hget(keys.ran, loop_id).decode() == next(n for n in names if n != holder)
    want = on_one_thread(evaluate_persisted, graph, persisted)
    for name in persisted:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name
    assert early_released(client, keys) == {}   # the completion consumed its marks instead of counting them again
    assert not any(client.hexists(keys.refs, i) for i in ids)


def test_a_spot_checked_loop_keeps_its_initial_values(engine, workers, client):
    workers.start(2, extra=("--checkpoint-steps", "5"))
    graph, persisted = record_fit("superseded under spot", epochs=200, verify="spot")
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    seen = []   # early releases seen while the loop runs and checkpoints (every 5 steps): none, they are kept
    wait_for(lambda: seen.append(early_released(client, keys)) or client.scard(keys.done) > 0 or None,
             "the loop's end")   # a segment re-run from the start reads them
    assert len(seen) > 1 and not any(seen)
    R.track_progress(timeout=300, progress_bar=False)
    want = on_one_thread(evaluate_persisted, graph, persisted)
    for name in persisted:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name


def test_the_worker_hands_the_initial_values_to_the_loop_uncached_and_it_trains_them_in_place(
        engine, server, monkeypatch):
    runs = []
    real_run = loop_run.LoopRun.run

    def run(self, *args, **kwargs):
        runs.append((self, list(self.initial or ())))
        return real_run(self, *args, **kwargs)
    monkeypatch.setattr(loop_run.LoopRun, "run", run)
    graph, persisted = record_fit("handed", epochs=3)
    R.activate()
    keys = GraphKeys(engine.token, graph.id)
    worker = Worker(connect(server.url), f"handed-{uuid.uuid4().hex[:6]}")
    R.execute()
    while worker.client.hget(keys.meta, "state").decode() not in (DONE, FAILED):
        message = worker._next()
        if message is not None:
            worker._handle(*message)
    (runner, initial), = runs
    assert len(runner.donated) >= 4   # the two Dense layers' weights and biases at least
    trained = {id(initial[k]) for k in runner.donated}
    held = [(key, value) for key, value in worker.cache._items.items() if id(value) in trained]
    assert held, "the loop's outputs are the tensors it was handed, trained in place"
    for key, value in held:   # cached only under the outputs' keys, never under an initial value's
        data = worker.client.get(key)
        assert data is not None and torch.equal(stored.decode(worker.client, key, data), value), key
    want = on_one_thread(evaluate_persisted, graph, persisted)
    for name in persisted:   # the same bits as the in-process run, whose loop copied its initial values
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name
