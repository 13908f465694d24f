"""R.flush deletes a token's keys by the names its records give (ravop.store.flush), without a SCAN of the whole
keyspace, and falls back to the SCAN where a graph may hold keys no record names; other tokens' keys stay."""
import numpy as np
import pytest

import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.store import GraphKeys, TokenKeys
from ravop.store import flush as flush_module

RNG = np.random.default_rng(5)
X = RNG.normal(size=(40, 4))
Y = np.eye(3)[RNG.integers(0, 3, 40)]


def run_graphs():
    """A fit (a loop with checkpoints, its losses, a prediction) and a plain graph, both done; the fit's Graph."""
    fit = R.Graph(name="fit", seed=1)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    for layer in (Dense(80, input_shape=(4,)), Activation("relu"), Dense(72), Dense(3)):
        model.add(layer)
    model.fit(X, Y, n_epochs=20, batch_size=8, shuffle=True)
    model.predict(X).persist_op("prediction")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    R.Graph(name="plain", seed=2)
    (R.t(X).sum() + 1).persist_op("total")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    return fit


@pytest.fixture
def no_scan(monkeypatch):
    def refuse(*args):
        raise AssertionError("R.flush scanned the keyspace")
    monkeypatch.setattr(flush_module, "_scan_delete", refuse)


@pytest.fixture
def scans(monkeypatch):
    calls = []
    scan = flush_module._scan_delete

    def counted(*args):
        calls.append(args[1])
        return scan(*args)
    monkeypatch.setattr(flush_module, "_scan_delete", counted)
    return calls


def token_keys(client, token):
    return client.keys(TokenKeys(token).pattern)


def test_a_flush_of_done_graphs_deletes_every_key_by_name(engine, workers, client, no_scan):
    workers.start(1, extra=("--checkpoint-steps", "7"))
    other = "other-token-flush"
    client.set(TokenKeys(other).current, "x")
    client.set(GraphKeys(other, "g1").meta, "x")
    run_graphs()
    assert len(token_keys(client, engine.token)) > 10
    R.flush()
    assert token_keys(client, engine.token) == []
    assert len(token_keys(client, other)) == 2   # another token's keys are not touched
    R.flush()   # idempotent, and a token with nothing has nothing to scan for
    assert token_keys(client, engine.token) == []


@pytest.mark.parametrize("mark", ["redelivered", "failed", "legacy", "checkpoint"])
def test_a_graph_whose_records_may_not_name_every_key_is_flushed_by_scan(engine, workers, client, scans, mark):
    workers.start(1)
    graph = run_graphs()
    keys = GraphKeys(engine.token, graph.id)
    client.set(keys.prefix + "ckpt:0:25:0", b"left by a worker that died")   # a key no record names
    if mark == "redelivered":
        client.hset(keys.meta, "redelivered", 1)
    elif mark == "failed":
        client.hset(keys.meta, "state", "failed")
    elif mark == "legacy":
        client.srem(TokenKeys(engine.token).owned, graph.id)   # listed by a version that recorded no `owned`
    else:
        client.hset(keys.checkpoint(0), mapping={"step": 25, "n": 1})
    R.flush()
    assert scans == [TokenKeys(engine.token).pattern]
    assert token_keys(client, engine.token) == []


def test_an_upload_cut_short_before_its_meta_is_flushed_by_name(engine, client, no_scan):
    graph = R.Graph(name="cut short", seed=3)
    (R.t(np.ones((100, 100))) * 2).persist_op("double")   # above constant folding's limit: a subgraph
    R.activate()
    keys = GraphKeys(engine.token, graph.id)
    client.delete(keys.meta, TokenKeys(engine.token).graphs)   # as if the upload had stopped before them
    assert client.exists(keys.subgraphs)
    R.flush()
    assert token_keys(client, engine.token) == []
