"""The session API end to end through a real Valkey server and real worker processes."""
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ravop as R
from ravop.core.errors import GraphStateError

ROOT = Path(__file__).resolve().parents[2]


def run(timeout=120):
    summary = R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=timeout)
    return summary


def test_arithmetic_example(engine, module_workers):
    R.Graph(name="demo", algorithm="addition", approach="distributed")
    a = R.t([1, 2, 3])
    b = R.t([4, 5, 6])
    c = a + b
    c.persist_op(name="c_output")
    summary = run()
    assert summary["recorded_ops"] == 3 and "demo" in str(summary)
    assert torch.equal(R.fetch_persisting_op(op_name="c_output"), torch.tensor([5, 7, 9]))


def test_linear_regression_example_equals_numpy(engine, module_workers):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import linear_regression as example
    finally:
        sys.path.remove(str(ROOT / "examples"))
    R.Graph(name="linear_regression")
    X, y = example.make_data()
    ops = example.record(X, y, iterations=30)
    ops["theta"].persist_op("theta")
    ops["r2"].persist_op("r2_score")
    summary = run()
    assert summary["subgraphs"] >= 1  # the workers ran it, not only the compiler's constant folding
    theta, r2 = example.numpy_reference(X, y, iterations=30)
    np.testing.assert_allclose(R.fetch_persisting_op("theta").numpy(), theta, rtol=1e-9, atol=1e-12)
    assert abs(float(R.fetch_persisting_op("r2_score")) - r2) < 1e-9


def test_fetch_before_it_is_computed_and_unknown_names(engine, module_workers):
    R.Graph(name="fetch")
    x = R.t(torch.arange(10_000, dtype=torch.float64).reshape(100, 100))
    y = (x @ x).sum(axis=0)
    y.persist_op("y")
    R.activate()
    with pytest.raises(R.NotComputedError, match="'y' is not computed yet") as info:
        R.fetch_persisting_op("y")
    assert "activated" in str(info.value)
    with pytest.raises(KeyError) as info:
        R.fetch_persisting_op("nope")
    assert isinstance(info.value, R.UnknownPersistName)
    assert "'nope'" in str(info.value) and "persisted names: y" in str(info.value)
    R.execute()
    got = R.fetch_persisting_op("y", wait=True, timeout=120)
    assert torch.equal(got, (torch.arange(10_000, dtype=torch.float64).reshape(100, 100) @
                             torch.arange(10_000, dtype=torch.float64).reshape(100, 100)).sum(axis=0))


def test_wait_times_out_clearly_when_nothing_runs(engine):
    R.Graph(name="never-started")
    (R.t(torch.ones(100, 100)) @ R.t(torch.ones(100, 100))).persist_op("p")
    R.activate()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="'p' is still not computed"):
        R.fetch_persisting_op("p", wait=True, timeout=0.5)
    assert time.monotonic() - start < 10


def test_flush_is_idempotent_and_leaves_other_tokens_alone(engine, module_workers, server, client):
    R.Graph(name="other")
    R.t([1.0, 2.0]).persist_op("kept")
    run()
    other = engine.token
    R.initialize(token=f"{other}-b", redis_url=server.url)
    R.Graph(name="mine")
    R.t([3.0]).persist_op("gone")
    run()
    assert client.keys(f"ravop:{other}-b:*")
    R.flush()
    R.flush()
    assert client.keys(f"ravop:{other}-b:*") == []
    assert R.get_my_graphs() == []
    with pytest.raises(GraphStateError, match="no graph has been activated"):
        R.fetch_persisting_op("gone")
    R.initialize(token=other, redis_url=server.url)
    assert torch.equal(R.fetch_persisting_op("kept"), torch.tensor([1.0, 2.0]))


def test_activate_and_execute_check_the_graph_state(engine):
    R.Graph(name="nothing")
    R.t([1.0]) + R.t([2.0])
    with pytest.raises(GraphStateError, match="persists no op"):
        R.activate()
    R.Graph(name="not-yet")
    R.t([1.0]).persist_op("one")
    with pytest.raises(GraphStateError, match="not activated"):
        R.execute()
    R.activate()
    with pytest.raises(GraphStateError, match="activated"):
        R.t([2.0]) * 2
    with pytest.raises(GraphStateError, match="R.execute"):
        R.track_progress(progress_bar=False)


def test_a_bundle_is_rebuilt_by_the_loader_registered_for_its_kind(engine, module_workers):
    from ravop.client.session import LOADERS
    R.Graph(name="bundle")
    a = R.t(torch.ones(100, 100))
    R.current_graph().save_bundle("pair", "test.pair", {"label": "sum"}, {"a": a @ a, "b": a})
    run()
    LOADERS["test.pair"] = lambda spec, tensors: (spec["label"], tensors["a"] + tensors["b"])
    try:
        label, total = R.fetch_persisting_op("pair")
    finally:
        del LOADERS["test.pair"]
    assert label == "sum" and torch.equal(total, torch.full((100, 100), 101.0))
    assert torch.equal(R.fetch_persisting_op("pair::b"), torch.ones(100, 100))
    with pytest.raises(GraphStateError, match="no loader is registered"):
        R.fetch_persisting_op("pair")


def test_unreachable_redis_fails_fast_naming_the_url():
    for url in ("redis://127.0.0.1:1/0", "redis://10.255.255.1:6379/0"):
        start = time.monotonic()
        with pytest.raises(R.ConnectionFailed) as info:
            R.initialize(redis_url=url, timeout=2.0)
        assert url in str(info.value)
        assert time.monotonic() - start < 10


def test_requester_may_exit_after_execute(engine, module_workers, server):
    script = (
        "import torch, ravop as R\n"
        f"R.initialize({engine.token!r}, redis_url={server.url!r})\n"
        "R.Graph(name='detached', algorithm='matmul')\n"
        "x = R.t(torch.ones(300, 300)) @ R.t(torch.ones(300, 300))\n"
        "x.persist_op('x')\n"
        "R.activate()\n"
        "R.execute()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    R.initialize(engine.token, redis_url=server.url)  # a later process: finds the token's current graph
    R.track_progress(progress_bar=False, timeout=120)
    assert torch.equal(R.fetch_persisting_op("x"), torch.full((300, 300), 300.0))
    [graph] = R.get_my_graphs()
    assert (graph["name"], graph["algorithm"], graph["state"], graph["progress"]) == \
        ("detached", "matmul", "done", 100.0)
