"""The `ravop` command line against a real server and worker processes: status (workers with device, state,
threads, memory, heartbeat; graphs with progress), graphs, fetch to .npy/.pt, cancel, logs; --json on each;
finding the last embedded session without a URL."""
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ravop as R
from ravop.client import session as sessions
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam

ROOT = str(Path(__file__).resolve().parents[2])


def ravop(*args, env=None, check=True):
    """Run `python -m ravop ARGS` (what the `ravop` console script runs); returns the CompletedProcess."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
                   **(env or {})}
    result = subprocess.run([sys.executable, "-m", "ravop", *args], capture_output=True, text=True, timeout=120,
                            env=environment)
    if check:
        assert result.returncode == 0, f"ravop {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
    return result


def ravop_json(*args, url, token):
    return json.loads(ravop(*args, "--redis", url, "--token", token, "--json").stdout)


def train_small_model():
    """A trained regression MLP whose graph persists its losses, a prediction and the saved model."""
    R.Graph(name="cli-train")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 8)).astype(np.float32)
    y = X[:, :1] * 2 + 1
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(16, input_shape=(8,)))
    model.add(Activation("relu"))
    model.add(Dense(1))
    model.fit(X, y, n_epochs=3, batch_size=50)
    model.predict(X[:10]).persist_op("prediction")
    model.save_model("net")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    return X[:10]


def test_status_and_graphs_show_workers_and_graphs(server, engine, workers):
    names = workers.start(2)
    train_small_model()
    report = ravop_json("status", url=server.url, token=engine.token)
    assert set(report) >= {"workers", "graphs", "token", "time"}
    by_name = {w["name"]: w for w in report["workers"]}
    assert set(names) <= set(by_name)
    for name in names:
        worker = by_name[name]
        assert worker["device"] == "cpu" and worker["state"] in ("idle", "running")
        assert worker["threads"] == 1 and worker["memory_limit"] > 0 and worker["rss"] > 10 * 2**20
        assert 0 <= worker["last_heartbeat_age"] < 30
    [graph] = report["graphs"]
    assert (graph["id"], graph["name"], graph["state"], graph["progress"]) == (engine.graph_id, "cli-train", "done",
                                                                              100.0)
    assert graph["elapsed"] > 0 and graph["eta"] is None and graph["age"] >= graph["elapsed"]
    assert ravop_json("graphs", url=server.url, token=engine.token)["graphs"][0]["id"] == engine.graph_id
    text = ravop("status", "--redis", server.url, "--token", engine.token).stdout
    assert all(name in text for name in names) and "cli-train" in text and "100.0%" in text


def test_fetch_writes_tensors_and_models(server, engine, workers, tmp_path):
    workers.start(1)
    X = train_small_model()
    want = R.fetch_persisting_op("prediction")
    for suffix in (".npy", ".pt"):
        path = tmp_path / f"prediction{suffix}"
        written = ravop_json("fetch", "cli-train", "prediction", "-o", str(path), url=server.url, token=engine.token)
        assert written == {"graph": engine.graph_id, "name": "prediction", "file": str(path), "kind": "tensor",
                           "shape": [10, 1], "dtype": "float32"}
        got = torch.from_numpy(np.load(path)) if suffix == ".npy" else torch.load(path)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    path = tmp_path / "net.pt"
    assert ravop_json("fetch", engine.graph_id, "net", "-o", str(path), url=server.url,
                      token=engine.token)["kind"] == "module"
    torch.testing.assert_close(torch.jit.load(str(path))(torch.from_numpy(X)), want, rtol=0, atol=1e-6)
    bad = ravop("fetch", "cli-train", "prediction", "-o", str(tmp_path / "x.csv"), "--redis", server.url,
                "--token", engine.token, check=False)
    assert bad.returncode == 1 and "write it to a .npy or .pt file" in bad.stderr
    missing = ravop("fetch", "no-such-graph", "x", "-o", str(path), "--redis", server.url, "--token", engine.token,
                    check=False)
    assert missing.returncode == 1 and "no graph with id or name 'no-such-graph'" in missing.stderr


def test_cancel_stops_a_graph_and_logs_say_so(server, engine, client):
    R.Graph(name="waits-for-gpu", gpu_required="yes")  # no GPU worker: it stays running until cancelled
    (R.t(torch.ones(80, 80)) * 3).persist_op("x")  # too big to fold: a worker would run it
    R.activate()
    R.execute()
    assert ravop_json("cancel", "waits-for-gpu", url=server.url, token=engine.token) == {
        "graph": engine.graph_id, "cancelled": True}
    with pytest.raises(R.GraphCancelledError, match=r"graph 'waits-for-gpu' was cancelled by ravop cancel \(.+@.+, "
                                                     r"pid \d+\): cancelled by the user"):
        R.track_progress(progress_bar=False, timeout=30)
    again = ravop("cancel", "waits-for-gpu", "--redis", server.url, "--token", engine.token).stdout
    assert "already ended, nothing to cancel" in again
    [failure] = ravop_json("logs", "waits-for-gpu", url=server.url, token=engine.token)["failures"]
    assert failure["reason"] == "cancelled" and failure["error"] == "cancelled by the user"
    assert failure["by"].startswith("ravop cancel (")
    assert "cancelled: by ravop cancel (" in ravop("logs", "waits-for-gpu", "--redis", server.url, "--token",
                                                   engine.token).stdout
    [graph] = ravop_json("graphs", url=server.url, token=engine.token)["graphs"]
    assert graph["state"] == "cancelled"


def test_logs_name_the_failing_op_and_source_line(server, engine, workers):
    [name] = workers.start(1)
    R.Graph(name="singular")
    line = inspect.currentframe().f_lineno + 1
    R.inv(R.t(torch.zeros(80, 80))).persist_op("inverse")
    R.activate()
    R.execute()
    with pytest.raises(R.GraphFailedError):
        R.track_progress(progress_bar=False, timeout=120)
    [failure] = ravop_json("logs", "singular", url=server.url, token=engine.token)["failures"]
    assert failure["op"] == "inv" and failure["worker"] == name and failure["reason"] == "kernel error"
    assert failure["source"].endswith(f"test_cli.py:{line}") and "singular" in failure["error"]
    text = ravop("logs", "singular", "--redis", server.url, "--token", engine.token).stdout
    assert f"kernel error: op 'inv' at {failure['source']} on worker {name}" in text


def test_without_a_url_it_finds_the_last_embedded_session(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("RAVOP_REDIS_URL", raising=False)
    monkeypatch.delenv("RAVOP_TOKEN", raising=False)
    nothing = ravop("status", "--json", check=False)
    assert nothing.returncode == 1 and "no server given" in nothing.stderr
    session = R.initialize(token="embedded-cli", workers=0)  # an embedded server without workers
    try:
        R.Graph(name="embedded-graph")
        (R.t([1.0]) + 1).persist_op("y")
        R.activate()
        report = json.loads(ravop("status", "--json").stdout)
        assert report["token"] == "embedded-cli" and report["workers"] == []
        assert [g["name"] for g in report["graphs"]] == ["embedded-graph"]
    finally:
        session.close()
        sessions._session = None
