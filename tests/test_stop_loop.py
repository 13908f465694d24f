"""A stop request and a cancel felt by a loop running on a real worker process: a stopped loop ends at an epoch
boundary with the values of the run recorded that many epochs long, bit for bit, what follows it runs and the
graph ends done; a cancelled graph ends 'cancelled' within about a second, naming who cancelled it; the loop's
own stop rule (LoopRun.run's `stop`) in process."""
import json
import time

import numpy as np
import pytest
import torch

import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop import graph_states, status
from ravop.cluster_cli import main as cli_main
from ravop.errors import GraphCancelledError
from ravop.store import graphs as store_graphs
from ravop.store import GROUP, queue

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


def test_a_stopped_loop_gives_the_values_of_the_shorter_run_bit_for_bit(engine, module_workers):
    net, history = record(LONG, "stopped")
    R.activate()
    R.execute()
    keys = engine.keys()
    wait_for(lambda: store_graphs.steps_done(engine.client, keys) >= 3 * ROWS // BATCH, "three epochs run")
    assert status.request_stop(engine.client, keys, "enough for the test", "test_stop_loop")
    R.track_progress(progress_bar=False)
    meta = engine.client.hgetall(keys.meta)
    assert meta[b"state"] == graph_states.DONE.encode()
    stopped = meta[b"stopped"].decode()
    epochs = int(stopped.split("at epoch ")[1].split(" ")[0])
    assert stopped == f"stopped early at epoch {epochs} of {LONG} (enough for the test)"
    assert 3 <= epochs < LONG and int(meta[b"stopped_step"]) == epochs * ROWS // BATCH
    assert meta[b"stop_by"].decode().startswith("test_stop_loop (")
    stopped_weights, stopped_prediction = weights(net), R.fetch_persisting_op("prediction")
    # History holds the epochs run, every loss computed
    assert history.stopped_after == epochs and len(history.history["loss"]) == epochs
    assert len(history.batch_losses) == epochs * ROWS // BATCH and np.isfinite(history.batch_losses).all()
    listed = {g["id"]: g for g in R.get_my_graphs(show=False)}
    assert listed[keys.graph_id]["state"] == graph_states.DONE
    # the same fit recorded with that many epochs: the same bits
    short, short_history = record(epochs, "short")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    assert engine.client.hget(engine.keys().meta, "stopped") is None
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
