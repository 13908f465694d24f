"""What a worker's loop holds (issue 46): a checkpoint that a store should take within a step (the embedded server,
a server on this host) is written from the loop's own tensors, with no host copy of the state; to a slower one,
from its one host copy; either way beside the loop, whose next optimizer updates wait for what reads the tensors
(worker/loops/checkpoint_cadence.py). And once the loop has run,
the worker gives back to the operating system what it freed (its gradients, activations, checkpoint buffer, which
glibc keeps in the heap), before its outputs go up to the server that still holds its last checkpoint."""
import re
import time
import uuid

import numpy as np
import pytest
import torch

import ravop as R
from helpers import on_one_thread, wait_for
from ravop.core.graph_states import DONE, FAILED
from ravop.runtime.evaluate import evaluate_persisted
from ravop.store import GraphKeys, connect
from worker import Worker
from worker.loops import checkpoint_buffer, loop_subgraph
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam

RNG = np.random.default_rng(7)
X = RNG.normal(size=(256, 64))
Y = np.eye(4)[RNG.integers(0, 4, 256)]


def test_a_worker_returns_what_a_loop_freed_to_the_os(engine, workers, client):
    [name] = workers.start(1, extra=("--checkpoint-steps", "5", "-v"))
    R.Graph(name="loop memory", seed=1)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(176, input_shape=(64,)))
    for _ in range(30):   # 121-176 KiB tensors: heap blocks under glibc's mmap threshold, kept when freed
        model.add(Activation("relu"))
        model.add(Dense(176))
    model.add(Dense(4))
    list(model.fit(X, Y, n_epochs=10, batch_size=256))
    model.persist_weights()
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    line = wait_for(lambda: re.search(r"RSS ([\d,.]+) MiB after a loop, ([\d,.]+) MiB once its values were "
                                      r"collected, ([\d,.]+) MiB after returning", workers.log(name)),
                    "the worker to log its RSS after the loop")
    before, _, after = (float(v.replace(",", "")) for v in line.groups())
    print(f"\nworker RSS after the loop: {before:,.1f} MiB, {after:,.1f} MiB after malloc_trim(0)")
    # what comes back depends on the heap's layout (glibc's mmap threshold moves as blocks are freed): often a few
    # MiB here, the checkpoint buffer's 12 bytes a parameter with a slow store (malloc_trim: tests/core/test_heap.py)
    assert after <= before


def _fit_on_one_worker(engine, server, name, seed, store_bytes_per_s):
    """(graph, loss names) of a 4-epoch fit run in this process by one worker checkpointing every 5 steps, whose
    calibration measured its store at `store_bytes_per_s`."""
    graph = R.Graph(name=name, seed=seed)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    for layer in (Dense(32, input_shape=(64,)), Activation("relu"), Dense(4)):
        model.add(layer)
    names = list(model.fit(X, Y, n_epochs=4, batch_size=32))
    R.activate()
    keys = GraphKeys(engine.token, graph.id)
    worker = Worker(connect(server.url), f"loop-{uuid.uuid4().hex[:6]}", checkpoint_steps=5)
    worker.store_bytes_per_s = store_bytes_per_s
    R.execute()
    while worker.client.hget(keys.meta, "state").decode() not in (DONE, FAILED):
        message = worker._next()
        if message is not None:
            worker._handle(*message)
    return graph, names


@pytest.mark.parametrize("store_bytes_per_s", [4e8, 1e3], ids=["fast store", "slow store"])
def test_checkpoints_to_a_fast_store_are_written_from_the_loops_own_tensors(engine, server, monkeypatch,
                                                                           store_bytes_per_s):
    copies, checkpoints = [], []
    fill, transaction = checkpoint_buffer.CheckpointBuffer.fill, loop_subgraph._Writer._transaction
    monkeypatch.setattr(checkpoint_buffer.CheckpointBuffer, "fill", lambda self, carried: copies.append(1) or
                        fill(self, carried))

    def writing(self, done, pending, host, *rest):
        if host is not None:
            checkpoints.append(done)
        return transaction(self, done, pending, host, *rest)
    monkeypatch.setattr(loop_subgraph._Writer, "_transaction", writing)
    graph, names = _fit_on_one_worker(engine, server, "checkpoint in the loop", 2, store_bytes_per_s)
    # asked for every 5 of its 32 steps, written beside the loop (the next step's optimizer updates wait for them),
    # one in flight at a time, so on a loaded machine fewer land (2 of 6 seen)
    assert len(checkpoints) >= 1
    # no host copy where the store should take the state (28 KB) within a step; one at 1 KB/s, filled beside the
    # loop (the calibrated rate is where the worker starts: its writes here measure the real one)
    assert (len(copies) > 0) == (store_bytes_per_s < 1e8)
    want = on_one_thread(evaluate_persisted, graph, names)
    for name in names:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name


def test_a_checkpoint_read_beside_the_loop_keeps_the_state_of_its_step(engine, server, monkeypatch):
    """A checkpoint read from the loop's own tensors while the loop goes on: its next optimizer updates, which
    overwrite those tensors in place, wait for the read (ravop/runtime/loop_run.py `LoopRun.fence`), so a write held
    up 0.3 s still stores the state of the step it was taken at, and the loop's results are unchanged."""
    taken, stored, copies = {}, {}, []
    take, transaction = loop_subgraph._Writer._take, loop_subgraph._Writer._transaction
    fill = checkpoint_buffer.CheckpointBuffer.fill

    def taking(self, done, carried, record, copy, fenced=False):
        result = take(self, done, carried, record, copy, fenced)
        if result[2] is not None:
            taken[done] = [t.clone() for t in result[2]]
        return result

    def slow(self, done, pending, host, *rest):
        if host is not None:
            time.sleep(0.3)   # meanwhile the loop runs on, up to its next optimizer update
            stored[done] = ([t.clone() for t in host], len(copies))
        return transaction(self, done, pending, host, *rest)
    monkeypatch.setattr(loop_subgraph._Writer, "_take", taking)
    monkeypatch.setattr(loop_subgraph._Writer, "_transaction", slow)
    monkeypatch.setattr(checkpoint_buffer.CheckpointBuffer, "fill", lambda self, carried: copies.append(1) or
                        fill(self, carried))
    graph, names = _fit_on_one_worker(engine, server, "checkpoint beside the loop", 3, 4e8)
    first = min(stored)
    assert stored[first][1] == 0   # the first was read from the loop's own tensors (no copy made before it)
    for done, (values, _) in stored.items():
        assert all(torch.equal(a, b) for a, b in zip(values, taken[done])), done
    want = on_one_thread(evaluate_persisted, graph, names)
    for name in names:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name
