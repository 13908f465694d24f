"""Real-server fixtures: a Valkey server for the test session, and real worker processes per test."""
import os
import subprocess
import sys
import time
import uuid

import pytest
import redis

import ravop as R
from ravop import session, store
from ravop.embedded import EmbeddedCluster


@pytest.fixture(scope="session")
def server():
    cluster = EmbeddedCluster(workers=0)
    yield cluster
    cluster.stop()


class Workers:
    """Start and stop `ravop-worker` processes against the test server."""

    def __init__(self, url):
        self.url = url
        self.procs = {}

    def start(self, name=None, reclaim_idle=1.0, device="cpu", wait=True):
        name = name or f"w-{uuid.uuid4().hex[:6]}"
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "worker", "--redis", self.url, "--name", name, "--device", device,
             "--reclaim-idle", str(reclaim_idle), "--max-attempts", "3"])
        if wait:
            client = redis.Redis.from_url(self.url)
            deadline = time.monotonic() + 60
            while not client.exists(store.worker_key("cpu", name)):
                assert self.procs[name].poll() is None, f"worker {name} exited at start"
                assert time.monotonic() < deadline, f"worker {name} did not register"
                time.sleep(0.05)
        return name

    def kill(self, name):
        self.procs[name].kill()
        self.procs[name].wait()
        redis.Redis.from_url(self.url).delete(store.worker_key("cpu", name))

    def alive(self, name):
        return self.procs[name].poll() is None

    def stop_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def workers(server):
    pool = Workers(server.url)
    yield pool
    pool.stop_all()


@pytest.fixture
def engine(server):
    """A session on the test server under a fresh token, with a fresh graph."""
    R.initialize(token=f"test-{uuid.uuid4().hex[:8]}", redis_url=server.url)
    R.flush()
    yield server
    R.flush()
    session._session.client = None
