"""End to end through a real Valkey server and real worker processes."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import ravop as R
from ravop import session, store
from ravop.graph import current_graph
from ravop.store import GraphKeys


def run_graph(timeout=120):
    R.activate()
    R.execute()
    R.track_progress(timeout=timeout, progress_bar=False)


def heavy_chain(seed, n=256, steps=12):
    g = torch.Generator().manual_seed(seed)
    a, b = R.t(torch.rand(n, n, generator=g)), R.t(torch.rand(n, n, generator=g) / n)
    x = a
    for _ in range(steps):
        x = R.matmul(x, b) + a
    return x


def test_arithmetic_example(engine, workers):
    workers.start()
    R.Graph(name="demo", algorithm="addition", approach="distributed")
    c = R.t([1, 2, 3]) + R.t([4, 5, 6])
    c.persist_op(name="c_output")
    run_graph()
    assert torch.equal(R.fetch_persisting_op(op_name="c_output"), torch.tensor([5, 7, 9]))


def test_linear_regression_equals_numpy(engine, workers):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import linear_regression as lr
    workers.start()
    R.Graph(name="lr")
    X, y = lr.make_data()
    lr.record(X, y, iterations=30)
    run_graph()
    theta, r2 = lr.numpy_reference(X, y, iterations=30)
    np.testing.assert_allclose(R.fetch_persisting_op("theta").numpy(), theta, rtol=1e-10, atol=1e-12)
    assert abs(float(R.fetch_persisting_op("r2_score")) - r2) < 1e-10


def test_independent_branches_use_two_workers(engine, workers):
    names = {workers.start(), workers.start()}
    R.Graph(name="branches")
    x, y = heavy_chain(1, n=384, steps=30), heavy_chain(2, n=384, steps=30)
    x.persist_op("x")
    y.persist_op("y")
    summary = R.activate()
    assert summary["max_parallel_width"] >= 2
    R.execute()
    R.track_progress(timeout=120, progress_bar=False)
    keys = GraphKeys(session._session.token, current_graph().id)
    ran_by = {v.decode() for v in session._client().hvals(keys.ran_by)}
    assert ran_by == names


def test_sigkill_mid_subgraph_completes_elsewhere(engine, workers):
    first = workers.start(reclaim_idle=1.0)
    R.Graph(name="killed")
    x = heavy_chain(3, n=512, steps=60)
    x.persist_op("x")
    R.activate()
    R.execute()
    client = session._client()
    deadline = time.monotonic() + 60
    while not client.xpending(store.queue("cpu"), store.GROUP)["pending"]:
        assert time.monotonic() < deadline, "the worker never claimed the subgraph"
        time.sleep(0.01)
    workers.kill(first)
    second = workers.start(reclaim_idle=1.0)
    R.track_progress(timeout=120, progress_bar=False)
    keys = GraphKeys(session._session.token, current_graph().id)
    assert {v.decode() for v in client.hvals(keys.ran_by)} == {second}
    from ravop.interpreter import evaluate
    torch.testing.assert_close(R.fetch_persisting_op("x"), evaluate(x), rtol=0, atol=0)


def test_shape_mismatch_raises_at_record_time_with_line(engine):
    R.Graph(name="bad")
    a, b = R.t(np.ones((2, 3))), R.t(np.ones((4, 5)))
    with pytest.raises(R.ShapeError) as info:
        R.matmul(a, b)
    assert "matmul" in str(info.value) and "test_integration_engine.py" in str(info.value)


def test_kernel_error_surfaces_with_op_and_line(engine, workers):
    workers.start()
    R.Graph(name="singular")
    out = R.inv(R.zeros((80, 80)) + R.random(size=(80, 80)) * 0.0)
    out.persist_op("inv")
    R.activate()
    R.execute()
    with pytest.raises(R.GraphFailedError) as info:
        R.track_progress(timeout=60, progress_bar=False)
    message = str(info.value)
    assert "'inv'" in message and "test_integration_engine.py" in message
    with pytest.raises(R.GraphFailedError):
        R.fetch_persisting_op("inv")


def test_hostile_messages_do_not_kill_the_worker(engine, workers):
    name = workers.start()
    client = session._client()
    stream = store.queue("cpu")
    client.xadd(stream, {"garbage": b"\xff\x00\x13"})
    client.xadd(stream, {"token": "x", "graph": "y", "sg": "not-a-number"})
    from ravop.wire import plan_pb2
    for i, node in enumerate([plan_pb2.Node(id=1, op="no_such_op"),
                              plan_pb2.Node(id=1, op="zeros", shape=[10**12, 10**6], dtype="float32",
                                            params=b'{"shape":[1000000000000,1000000],"dtype":"float32"}')]):
        keys = GraphKeys("hostile", f"g{i}")
        client.hset(keys.meta, mapping={"state": "running", "n_subgraphs": 1, "seed": 0})
        sub = plan_pb2.Subgraph(id=0, nodes=[node], outputs=[1])
        client.hset(keys.plan, 0, sub.SerializeToString())
        client.xadd(stream, {"token": "hostile", "graph": f"g{i}", "sg": 0})
    keys = GraphKeys("hostile", "g2")
    client.hset(keys.meta, mapping={"state": "running", "n_subgraphs": 1, "seed": 0})
    client.hset(keys.plan, 0, b"\x00garbage protobuf\xff")
    client.xadd(stream, {"token": "hostile", "graph": "g2", "sg": 0})
    R.Graph(name="after")
    c = heavy_chain(4, n=128, steps=3)
    c.persist_op("c")
    run_graph()
    assert workers.alive(name)
    for i in range(3):
        meta = client.hgetall(GraphKeys("hostile", f"g{i}").meta)
        assert meta[b"state"] == b"failed", meta
    assert b"unknown op" in client.hget(GraphKeys("hostile", "g0").meta, "error")
    assert b"MiB" in client.hget(GraphKeys("hostile", "g1").meta, "error")
    assert client.xlen(store.DEAD_LETTER) >= 2
    client.delete(*client.keys("ravop:hostile:*"))


def test_fetch_errors_and_wait(engine, workers):
    R.Graph(name="fetch")
    x = heavy_chain(5, n=128, steps=3)
    x.persist_op("x")
    R.activate()
    with pytest.raises(R.NotComputedError):
        R.fetch_persisting_op("x")
    with pytest.raises(KeyError) as info:
        R.fetch_persisting_op("y")
    assert "'y'" in str(info.value)
    R.execute()
    workers.start()
    assert R.fetch_persisting_op("x", wait=True, timeout=60).shape == (128, 128)
    R.flush()
    R.flush()  # idempotent
    assert R.get_my_graphs() == []


def test_unreachable_redis_fails_fast():
    start = time.monotonic()
    with pytest.raises(R.ConnectionFailed) as info:
        R.initialize(redis_url="redis://127.0.0.1:1/0")
    assert "redis://127.0.0.1:1/0" in str(info.value)
    assert time.monotonic() - start < 10
    session._session.client = None


def test_same_results_with_one_or_two_workers(engine, workers):
    def record():
        R.Graph(name="det", seed=7)
        noise = R.random_uniform(0.0, 1.0, size=(200, 200))
        a = heavy_chain(6, n=200, steps=8) + noise
        b = heavy_chain(7, n=200, steps=8) * R.random(size=(200, 200))
        (a + b).persist_op("out")

    workers.start()
    record()
    run_graph()
    one = R.fetch_persisting_op("out")
    workers.start()
    record()
    run_graph()
    torch.testing.assert_close(R.fetch_persisting_op("out"), one, rtol=0, atol=0)


def test_requester_may_exit_after_execute(engine, workers, server, tmp_path):
    token = session._session.token
    script = tmp_path / "submit.py"
    script.write_text(
        "import ravop as R, torch\n"
        f"R.initialize({token!r}, redis_url={server.url!r})\n"
        "R.Graph(name='detached')\n"
        "x = R.t(torch.ones(300, 300)) @ R.t(torch.ones(300, 300))\n"
        "x.persist_op('x')\n"
        "R.activate(); R.execute()\n")
    subprocess.run([sys.executable, str(script)], check=True, timeout=120)
    workers.start()
    R.initialize(token, redis_url=server.url)
    R.track_progress(timeout=60, progress_bar=False)
    assert torch.equal(R.fetch_persisting_op("x"), torch.full((300, 300), 300.0))
    assert [g["name"] for g in R.get_my_graphs()] == ["detached"]
