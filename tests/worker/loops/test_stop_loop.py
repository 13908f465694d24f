"""A stop request and a cancel felt by a loop running on a real worker process: a stopped loop ends at an epoch
boundary with the values of the run recorded that many epochs long, bit for bit, what follows it runs and the
graph ends done; a cancelled graph ends 'cancelled' within about a second, naming who cancelled it; the loop's
own stop rule (LoopRun.run's `stop`) in process."""
import json
import time

import numpy as np
import pytest
import torch

from compiler import compile_graph
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.core import graph_states
from ravop.core.errors import GraphCancelledError
from ravop.record.loop import Loop
from ravop.runtime.loop_run import LoopRun
from ravop.store import graphs as store_graphs
from ravop.store import GROUP, queue
from ravop.tools import status
from ravop.tools.cluster_cli import main as cli_main
from ravop.wire import unpack_loop, unpack_nodes

from helpers import wait_for

ROWS, BATCH = 64, 16     # 4 steps an epoch
LONG = 20_000            # epochs: far more than a test waits for


def record(epochs, graph_name):
    """A shuffled fit of `epochs` epochs, its weights and predictions persisted; returns the model and X."""
    R.Graph(name=graph_name, seed=7)
    rng = np.random.default_rng(5)
    X = rng.normal(size=(ROWS, 6)).astype(np.float32)
    y = X[:, :1] * 0.5 - X[:, 1:2] ** 2
    net = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    net.add(Dense(12, input_shape=(6,)))
    net.add(Activation("tanh"))
    net.add(Dense(1))
    history = net.fit(X, y, n_epochs=epochs, batch_size=BATCH, shuffle=True, persist_weights=True)
    net.predict(X).persist_op("prediction")
    return net, history


def weights(net):
    return {f"{name}.{key}": R.fetch_persisting_op(f"{name}.{key}")
            for name, layer in net.leaf_layers() for key in layer.state()}


def test_a_stopped_loop_gives_the_values_of_the_shorter_run_bit_for_bit(engine, module_workers, capsys):
    net, history = record(LONG, "stopped")
    R.activate()
    R.execute()
    keys = engine.keys()
    wait_for(lambda: store_graphs.steps_done(engine.client, keys) >= 3 * ROWS // BATCH, "three epochs run")
    assert cli_main(["stop", keys.graph_id, "--reason", "enough for the test", "--redis", engine.url, "--token",
                     engine.token, "--json"]) == 0
    R.track_progress(progress_bar=False)
    meta = engine.client.hgetall(keys.meta)
    assert meta[b"state"] == graph_states.DONE.encode()
    stopped = meta[b"stopped"].decode()
    epochs = int(stopped.split("at epoch ")[1].split(" ")[0])
    assert stopped == f"stopped early at epoch {epochs} of {LONG} (enough for the test)"
    assert 3 <= epochs < LONG and int(meta[b"stopped_step"]) == epochs * ROWS // BATCH
    assert meta[b"stop_by"].decode().startswith("ravop stop (")
    # once it has ended, a stop asks nothing
    assert not status.request_stop(engine.client, keys, "too late", "test_stop_loop")
    # History holds the epochs run, every loss computed
    assert history.stopped_after == epochs and len(history.history["loss"]) == epochs
    assert history.stop_reason == "enough for the test"
    assert len(history.batch_losses) == epochs * ROWS // BATCH and np.isfinite(history.batch_losses).all()
    listed = {g["id"]: g for g in R.get_my_graphs(show=False)}
    assert listed[keys.graph_id]["state"] == graph_states.DONE and listed[keys.graph_id]["stopped"] == stopped
    assert cli_main(["graphs", "--redis", engine.url, "--token", engine.token]) == 0
    assert "done (stopped early)" in capsys.readouterr().out
    assert_the_bits_of_the_fit_recorded(epochs, net, history)
    assert engine.client.hget(engine.keys().meta, "stopped") is None


def assert_the_bits_of_the_fit_recorded(epochs, net, history):
    """The stopped fit's weights, prediction and batch losses are those of the same fit recorded `epochs` epochs
    long (run now, on the workers)."""
    stopped_weights, stopped_prediction = weights(net), R.fetch_persisting_op("prediction")
    short, short_history = record(epochs, "short")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    for name, value in weights(short).items():
        assert torch.equal(value, stopped_weights[name]), name
    assert torch.equal(R.fetch_persisting_op("prediction"), stopped_prediction)
    assert np.array_equal(short_history.batch_losses, history.batch_losses)


def _running_loops(client):
    """How many messages the workers hold (the loop's, while it runs: nothing else runs in these tests)."""
    return client.xpending(queue("cpu"), GROUP)["pending"]


def test_a_cancel_is_felt_inside_a_running_loop(engine, module_workers, capsys):
    record(LONG, "cancelled")
    R.activate()
    R.execute()
    keys = engine.keys()
    wait_for(lambda: store_graphs.steps_done(engine.client, keys) >= 8, "the loop running")
    assert _running_loops(engine.client) == 1
    assert cli_main(["cancel", keys.graph_id, "--redis", engine.url, "--token", engine.token]) == 0
    cancelled_at = time.monotonic()
    # the worker leaves the loop and acks its message
    wait_for(lambda: _running_loops(engine.client) == 0, "the worker leaving the loop")
    with capsys.disabled():
        print(f"\ncancel felt after {time.monotonic() - cancelled_at:.2f} s")
    assert f"graph {keys.graph_id}: cancelled" in capsys.readouterr().out
    steps = store_graphs.steps_done(engine.client, keys)
    assert 8 <= steps < LONG * ROWS // BATCH
    meta = store_graphs.read_state(engine.client, keys)
    assert meta["state"] == graph_states.CANCELLED
    assert meta["cancelled_by"].startswith("ravop cancel (") and meta["error_subgraph"] == ""
    with pytest.raises(GraphCancelledError, match=r"graph 'cancelled' was cancelled by ravop cancel \(.*\): "
                                                   "cancelled by the user"):
        R.track_progress(progress_bar=False)
    with pytest.raises(GraphCancelledError):
        R.fetch_persisting_op("prediction")
    # `ravop graphs` and `ravop logs` say it
    assert cli_main(["graphs", "--redis", engine.url, "--token", engine.token, "--json"]) == 0
    listed = {g["id"]: g for g in json.loads(capsys.readouterr().out)["graphs"]}
    assert listed[keys.graph_id]["state"] == graph_states.CANCELLED
    assert cli_main(["logs", keys.graph_id, "--redis", engine.url, "--token", engine.token]) == 0
    assert "cancelled: by ravop cancel (" in capsys.readouterr().out
    # a worker takes new work at once
    R.Graph(name="after")
    (R.t([1.0, 2.0]) * 2).persist_op("twice")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    assert torch.equal(R.fetch_persisting_op("twice"), torch.tensor([2.0, 4.0]))


def compiled_loop(rounds, times):
    """(LoopRun, reference) of w -> 2 w + 1 carried, `times` steps a round, `rounds` rounds."""
    graph = R.Graph(name="stoppable", seed=3)
    loop = Loop([R.t(torch.ones(3))])
    with loop.step() as step:
        (w,) = step.carried
        step.carry([w * 2 + 1])
    [final] = loop.run([(0, times)], rounds=rounds)
    final.persist_op("w")
    compiled = compile_graph(graph)
    [sub] = [s for s in compiled.plan.subgraphs if s.HasField("loop")]
    inputs = [compiled.constants[i] for i in unpack_nodes(sub.nodes)[0].inputs]
    return LoopRun(unpack_loop(sub.loop), inputs, compiled.plan.seed)


def asked_at(n):
    """A stop rule true from its `n`-th question on, counting the questions."""
    asked = []

    def stop():
        asked.append(len(asked))
        return len(asked) >= n
    return stop, asked


def test_a_loop_stops_only_at_an_epoch_boundary_with_the_shorter_loops_values():
    stop, asked = asked_at(3)                 # asked before rounds 1, 2, 3: stops before the third
    runner = compiled_loop(rounds=5, times=4)
    [after] = runner.run(stop=stop)
    assert runner.stopped_at == (8, 2, 8) and len(asked) == 3
    [two_rounds] = compiled_loop(rounds=2, times=4).run()
    assert torch.equal(after, two_rounds) and torch.equal(after, torch.full((3,), 2.0 ** 9 - 1))
    # resumed from a checkpoint within round 2: the first boundary is round 3's
    stop, asked = asked_at(1)
    [resumed] = runner.run([torch.full((3,), 2.0 ** 7 - 1)], start=6, stop=stop)
    assert runner.stopped_at == (8, 2, 8) and torch.equal(resumed, after)
    # never asked to stop: every round runs
    [full] = runner.run(stop=lambda: False)
    assert runner.stopped_at is None and torch.equal(full, torch.full((3,), 2.0 ** 21 - 1))


def test_a_loop_of_one_round_stops_after_any_step():
    stop, asked = asked_at(4)
    runner = compiled_loop(rounds=1, times=10)
    [after] = runner.run(stop=stop)
    assert runner.stopped_at == (3, 0, 3) and torch.equal(after, torch.full((3,), 2.0 ** 4 - 1))
