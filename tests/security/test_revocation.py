"""Revocation (`ravop admin token|worker revoke`) felt at once: a token's tracker raises naming the revocation,
its running graphs are cancelled naming it, and a worker whose user is revoked exits cleanly (status 1, one line),
idle or in the middle of a subgraph. The delays are measured and printed (pytest -s), not bounded: the machine
may be slow."""
import re
import threading
import time
import uuid
from datetime import datetime

import pytest
import redis
import torch

import ravop as R
from ravop.core import graph_states
from ravop.core.errors import ConnectionFailed, GraphFailedError
from ravop.tools import admin

from conftest import Workers
from helpers import wait_for


@pytest.fixture
def admin_client(server):
    client = redis.Redis.from_url(server.url)
    yield client
    client.close()


def waiting_graph(name):
    """A started graph that waits for a GPU worker (none runs here): running until something ends it."""
    R.Graph(name=name, gpu_required="yes")
    x = R.t(torch.ones(128, 128))
    (x @ x).persist_op("p")
    R.activate()
    R.execute()


def track_in_thread():
    """(thread, {"error", "at"}) of R.track_progress() running in a thread."""
    ended = {}

    def track():
        try:
            R.track_progress(progress_bar=False)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            ended.update(error=exc, at=time.monotonic())
    thread = threading.Thread(target=track)
    thread.start()
    return thread, ended


def test_a_revoked_tokens_tracker_raises_and_its_graphs_are_cancelled(server, admin_client):
    name = f"rev-{uuid.uuid4().hex[:6]}"
    url, _ = admin.create(admin_client, server.url, "token", name)
    R.initialize(redis_url=url)
    waiting_graph("revoked-while-running")
    keys = R.initialize(redis_url=url).keys()
    thread, ended = track_in_thread()
    time.sleep(1.0)   # the tracker is in its loop
    revoked_at = time.monotonic()
    _, cancelled = admin.revoke(admin_client, "token", name)
    thread.join()
    print(f"\ntracker felt the revocation after {ended['at'] - revoked_at:.2f} s")
    assert isinstance(ended["error"], (ConnectionFailed, GraphFailedError)), ended
    assert "revoked" in str(ended["error"])
    assert cancelled == [keys.graph_id]
    assert admin_client.hget(keys.meta, "state") == graph_states.CANCELLED.encode()
    assert b"revoked" in admin_client.hget(keys.meta, "error")


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "mid-subgraph"])
def test_a_worker_whose_user_is_revoked_exits_cleanly(server, admin_client, engine, tmp_path, busy):
    name = f"prov-{uuid.uuid4().hex[:6]}"
    url, _ = admin.create(admin_client, server.url, "worker", name)
    pool = Workers(url, tmp_path)
    try:
        [worker] = pool.start(1)
        if busy:   # a subgraph of seconds: many dependent matmuls, one subgraph
            R.Graph(name="long")
            a = R.t(torch.rand(500, 500))
            x = a
            for _ in range(600):
                x = R.matmul(x, a) / 500.0
            x.persist_op("x")
            R.activate()
            R.execute()
            wait_for(lambda: admin_client.hget(engine.keys().taken, 0), "the worker to take the subgraph")
        revoked_at = time.time()
        admin.revoke(admin_client, "worker", name)
        assert pool.procs[worker].wait() == 1
        exited = time.time() - revoked_at
        log = pool.log(worker)
        assert "refused its credentials" in log, log
        stamp = re.search(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) ravop.worker ERROR worker \S+: Redis refused its "
                          r"credentials", log)
        felt = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - revoked_at
        print(f"\nworker ({'mid-subgraph' if busy else 'idle'}) felt the revocation after {felt:.2f} s and exited "
              f"after {exited:.2f} s")
        assert "Traceback" not in log, log
    finally:
        pool.stop_all()
