"""Fixtures for integration tests against a real server and real worker processes: a private Valkey server
for the whole test session, `ravop-worker` processes started per test or per module (with short reclaim
times), and a requester session under a fresh token."""
import os
import signal
import time
import uuid

import pytest

import ravop as R
from ravop.local.embedded import LocalServer, start_worker
from ravop.runtime.evaluate import evaluate
from ravop.record.graph import set_current
from ravop.store import connect
from ravop.store.keys import worker_key

import file_budgets
import process_reaper
from helpers import run_ops

START_TIMEOUT = 120  # seconds for a worker to import torch and register, on a busy 2-core machine


def pytest_addoption(parser):
    file_budgets.add_option(parser)


def pytest_configure(config):
    process_reaper.install()
    file_budgets.install(config)   # a stated budget per test file: tests/durations.toml


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    process_reaper.begin_call()  # what the test body starts is its own, stopped after its teardown
    try:
        yield
    finally:
        process_reaper.end_call()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    stopped = process_reaper.stop_test_processes()
    if stopped:  # a failed or timed-out test, or one that forgot a clean-up: say so, it may be a leak
        item.warn(pytest.PytestWarning(f"stopped {len(stopped)} process(es) the test left running: {stopped}"))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    process_reaper.reap_all()  # after every fixture's teardown, also after Ctrl-C: nothing may remain


@pytest.fixture(scope="session", autouse=True)
def embedded_data_dir(tmp_path_factory):
    """Embedded sessions the tests start keep their snapshot, and note themselves as the last session
    (`ravop status`), in this run's temp dir: not the user's, nor another xdist worker's."""
    os.environ["RAVOP_DATA_DIR"] = str(tmp_path_factory.mktemp("ravop-data"))
    os.environ["XDG_RUNTIME_DIR"] = str(tmp_path_factory.mktemp("runtime"))


@pytest.fixture(scope="session")
def server():
    server = LocalServer()
    yield server
    server.stop()


@pytest.fixture
def client(server):
    client = connect(server.url)
    yield client
    client.close()


class Workers:
    """`python -m worker` processes against the test server, each logging to a file in `log_dir`."""

    def __init__(self, url, log_dir):
        self.url, self.log_dir = url, log_dir
        self.procs = {}
        self.client = connect(url)

    def start(self, count=1, reclaim_idle=1.0, max_attempts=3, extra=(), prefix="w", name=None, threads=1,
              env=None, wait=True):
        """Start `count` workers (of `threads` torch threads, with the variables of `env` added to their
        environment), wait until all have registered (unless `wait=False`), and return their names; `name`: one
        worker under that name (a worker restarted under the name of one that died)."""
        names = []
        saved = {key: os.environ.get(key) for key in env or {}}
        os.environ.update(env or {})   # the workers' environment is this process's (embedded.worker_environment)
        try:
            for _ in range(count):
                worker = name or f"{prefix}-{uuid.uuid4().hex[:6]}"
                self.procs[worker] = start_worker(self.url, worker, "cpu", threads=threads,
                                                  log_path=str(self.log_path(worker)),
                                                  extra_args=["--reclaim-idle", str(reclaim_idle), "--max-attempts",
                                                              str(max_attempts), *extra])
                names.append(worker)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        deadline = time.monotonic() + START_TIMEOUT
        for name in names if wait else ():
            while not self.client.exists(worker_key(name)):
                assert self.procs[name].poll() is None, f"worker {name} exited at start:\n{self.log(name)}"
                assert time.monotonic() < deadline, f"worker {name} did not register:\n{self.log(name)}"
                time.sleep(0.05)
        return names

    def log_path(self, name):
        return self.log_dir / f"{name}.log"

    def log(self, name):
        path = self.log_path(name)
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def alive(self, name):
        return self.procs[name].poll() is None

    def kill(self, name):
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(timeout=30)

    def terminate(self, name, timeout=60):
        """SIGTERM and wait; returns the exit code."""
        self.procs[name].terminate()
        return self.procs[name].wait(timeout=timeout)

    def stop_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - hung: make sure it does not outlive the test
                proc.kill()
                proc.wait()
        self.client.close()


@pytest.fixture
def workers(server, tmp_path):
    pool = Workers(server.url, tmp_path)
    yield pool
    pool.stop_all()


@pytest.fixture(scope="module")
def module_workers(server, tmp_path_factory):
    """Two workers shared by the tests of a module that do not stop or count workers."""
    pool = Workers(server.url, tmp_path_factory.mktemp("workers"))
    pool.start(2)
    yield pool
    pool.stop_all()


@pytest.fixture
def engine(server):
    """A requester session on the test server under a fresh token; its graphs are flushed afterwards. No graph an
    earlier test recorded is current: a read of the current graph before one is recorded reads the token's."""
    set_current(None)
    session = R.initialize(token=f"test-{uuid.uuid4().hex[:8]}", redis_url=server.url)
    yield session
    R.initialize(token=session.token, redis_url=server.url)
    R.flush()


@pytest.fixture
def on_engine(engine, module_workers):
    """An executor like `ravop.runtime.evaluate.evaluate` (a list of Ops in, their tensors out) that runs the
    ops through the compiler, the test server and two worker processes."""
    return run_ops


@pytest.fixture(params=["in-process", "engine"])
def execute(request):
    """Each test using it runs twice: with `ravop.runtime.evaluate.evaluate`, then through the real engine."""
    if request.param == "in-process":
        return evaluate
    return request.getfixturevalue("on_engine")



@pytest.fixture
def no_loop_folding(monkeypatch):
    """Compile repeated steps unrolled, for tests whose graphs repeat small steps on purpose (to test
    partitioning, or a failover between subgraphs); folding (compiler/passes/loops.py) is tested in
    test_loop_folding.py."""
    from compiler.passes import loops as loops_pass
    monkeypatch.setattr(loops_pass, "_fold_once", lambda ir: (ir, 0))
