"""A loop's start over a slow link (worker/loops/loop_start.py, `Scripts.load`): what a loop reads before its first step
(its inputs, the same-host reference of its chunked data, its checkpoint record, the graph's state, stop request
and exchange readers) is one round trip, and a worker's first claim is one round trip. Counted as the round trips
the worker's own thread makes (a pipeline is one), on a real server; the worker runs in this process so that its
thread can be watched, and the results are checked against the in-process run (the same bits)."""
import threading
import time
import uuid

import numpy as np
import pytest
import redis.connection
import torch

from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.core.graph_states import DONE, FAILED
from ravop.runtime.evaluate import evaluate_persisted
from ravop.store import GraphKeys, Scripts, connect, same_host
from worker import Worker
from worker.loops import loop_subgraph
from worker.serve import consumer
from worker.serve.warm_connections import warm

RNG = np.random.default_rng(3)
X = RNG.random((512, 16), dtype=np.float32)   # 32 KiB: chunked under the 16 KiB chunks below
Y = np.eye(4, dtype=np.float32)[RNG.integers(0, 4, 512)]



def round_trips_to_first_step(monkeypatch):
    """RoundTrips marked where a loop's inputs start being read and where its first step starts."""
    trips = RoundTrips(monkeypatch)
    inputs, run = consumer.Worker._inputs, loop_subgraph.LoopRun.run

    def reading_inputs(self, keys, subgraph, *rest):
        if subgraph.HasField("loop"):
            trips.mark("inputs")
        return inputs(self, keys, subgraph, *rest)

    def running(self, *args, **kwargs):
        trips.mark("first step")
        return run(self, *args, **kwargs)
    monkeypatch.setattr(consumer.Worker, "_inputs", reading_inputs)
    monkeypatch.setattr(loop_subgraph.LoopRun, "run", running)
    return trips

def first_command(packed):
    """The name of the first command in what redis-py sends (RESP: *N, $len, NAME)."""
    head = bytes(packed[0] if isinstance(packed, list) else packed)[:64]
    return head.split(b"\r\n")[2].decode()


class RoundTrips:
    """The round trips one thread makes (redis-py sends each command, or pipeline, with one call), each as the
    name of its first command; `mark(what)` notes how many were made so far."""

    def __init__(self, monkeypatch):
        self.sent, self.marks, self.thread = [], {}, threading.get_ident()
        send = redis.connection.AbstractConnection.send_packed_command

        def counted(connection, command, check_health=True):
            if threading.get_ident() == self.thread:
                self.sent.append(first_command(command))
            return send(connection, command, check_health)
        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)

    def mark(self, what):
        self.marks.setdefault(what, len(self.sent))

    def between(self, first, last):
        return self.sent[self.marks[first]:self.marks[last]]


def record_fit(shuffle=False):
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(8, input_shape=(16,)))
    model.add(Activation("relu"))
    model.add(Dense(4))
    model.fit(X, Y, n_epochs=3, batch_size=64, shuffle=shuffle)
    model.persist_weights()


def client_state(worker, keys):
    return worker.client.hget(keys.meta, "state").decode()


def serve_until_done(worker, keys):
    """Run the graph's messages with `worker` (in this thread) until the graph ends."""
    while client_state(worker, keys) not in (DONE, FAILED):
        message = worker._next()
        if message is not None:
            worker._handle(*message)


@pytest.mark.parametrize("shuffle", [True, False], ids=["mapped", "streamed"])
def test_a_loop_reads_what_it_needs_before_its_first_step_in_one_round_trip(engine, server, monkeypatch, shuffle):
    """Shuffled, the chunked data set has a same-host file, whose reference is read with the inputs; in order, it
    streams (ravop.store.row_stream), its first chunks read as the first step reads its batch. The requester closes
    a file once its chunks are all sent (ravop.store.background_upload); kept open here, as it is while a big
    constant's chunks are still going up, so that the worker started after activation maps it."""
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", str(2**14))   # the data set is chunked
    monkeypatch.setattr(same_host, "close_file", lambda reference: None)
    graph = R.Graph(name="loop start", seed=4)
    record_fit(shuffle)
    R.activate()
    keys = GraphKeys(engine.token, graph.id)
    worker = Worker(connect(server.url), f"start-{uuid.uuid4().hex[:6]}")
    trips = round_trips_to_first_step(monkeypatch)
    R.execute()
    serve_until_done(worker, keys)
    assert client_state(worker, keys) == DONE
    before_first = trips.between("inputs", "first step")
    assert len(before_first) == 1, f"round trips before the loop's first step: {before_first}"
    want = evaluate_persisted(graph)
    for name, value in want.items():   # the chunked data mapped from its same-host file, or streamed: the same bits
        assert torch.equal(R.fetch_persisting_op(name), value), name


def test_a_registered_worker_has_put_the_scripts_on_the_server_and_claims_in_one_round_trip(engine, server, client,
                                                                                             workers, monkeypatch):
    scripts = Scripts(client)
    client.script_flush()   # as a server just started
    workers.start(1)
    shas = [s.sha for s in (scripts._claim, scripts._complete, scripts._start, scripts._dead)]
    assert client.script_exists(*shas) == [True] * len(shas)   # before any work was queued
    workers.stop_all()
    client.script_flush()
    graph = R.Graph(name="first claim", seed=5)
    record_fit()
    R.activate()
    worker = Worker(connect(server.url), f"claim-{uuid.uuid4().hex[:6]}")
    worker._load_scripts()   # what `run` does before registering
    trips = RoundTrips(monkeypatch)
    claim = consumer.Worker._claim

    def claiming(self, *args):
        trips.mark("claim")
        try:
            return claim(self, *args)
        finally:
            trips.mark("claimed")
    monkeypatch.setattr(consumer.Worker, "_claim", claiming)
    R.execute()
    serve_until_done(worker, GraphKeys(engine.token, graph.id))
    assert trips.between("claim", "claimed") == ["SISMEMBER"]   # one round trip: the ban, then the claim
    for name, value in evaluate_persisted(graph).items():
        assert torch.equal(R.fetch_persisting_op(name), value), name


def test_connections_opened_ahead_wait_idle_and_a_new_one_costs_no_client_setinfo(server, monkeypatch):
    client = connect(server.url)
    pool = client.connection_pool
    warm(client, 4)
    opened = pool._created_connections
    assert opened >= 4 and len(pool._available_connections) >= 4   # open and idle (connect's own among them)
    barrier = threading.Barrier(4)

    def command():
        barrier.wait()
        client.ping()
    threads = [threading.Thread(target=command) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert pool._created_connections == opened   # four threads at once found them open
    trips = RoundTrips(monkeypatch)
    connection = pool.make_connection()
    connection.connect()
    connection.disconnect()
    assert "CLIENT" not in trips.sent and len(trips.sent) <= 2, trips.sent   # HELLO and its health check
    client.close()


class _Died(BaseException):
    """A worker's death in the middle of a step: nothing of the worker's handles it."""


def test_a_taken_over_loop_reads_its_checkpoint_with_its_inputs(engine, server, monkeypatch):
    """A worker dies after its loop checkpointed (its message stays pending, its heartbeat silent); the worker that
    takes it over reads the checkpoint's tensors in the round trip of the loop's inputs (the takeover's count of
    attempts named them: worker/serve/attempts.py), and the results are the in-process run's bits."""
    graph = R.Graph(name="loop takeover", seed=4)
    record_fit()
    R.activate()
    keys = GraphKeys(engine.token, graph.id)
    dying = Worker(connect(server.url), f"dying-{uuid.uuid4().hex[:6]}", checkpoint_steps=1)
    on_step = loop_subgraph._Writer.on_step

    def dies_at_step_5(self, done, *args):
        on_step(self, done, *args)
        if done == 5:
            raise _Died()
    monkeypatch.setattr(loop_subgraph._Writer, "on_step", dies_at_step_5)
    R.execute()
    with pytest.raises(_Died):
        serve_until_done(dying, keys)
    monkeypatch.setattr(loop_subgraph._Writer, "on_step", on_step)
    # a checkpoint was published (each step asks for one; worker/loops/checkpoint_cadence.py takes none while the
    # last is still being written, so which steps have one depends on timing)
    assert int(dying.client.hget(keys.checkpoint(0), "step") or 0) >= 1
    survivor = Worker(connect(server.url), f"survivor-{uuid.uuid4().hex[:6]}", dead_after=0.1)
    time.sleep(0.2)   # the dead worker's message idle for dead_after
    trips = round_trips_to_first_step(monkeypatch)
    serve_until_done(survivor, keys)
    assert client_state(survivor, keys) == DONE
    assert survivor.client.hget(keys.ran, 0).decode() == survivor.name   # resumed by the survivor
    assert len(trips.between("inputs", "first step")) == 1, trips.between("inputs", "first step")
    want = evaluate_persisted(graph)
    for name, value in want.items():
        assert torch.equal(R.fetch_persisting_op(name), value), name
