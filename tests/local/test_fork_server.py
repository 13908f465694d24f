"""The embedded workers' fork server (worker/serve/forkserver.py, ravop/local/forked_workers.py): workers forked from
one process that imported torch once run graphs, die with their session however it ends, and a crash on that path is
reported by name; RAVOP_FORK_SERVER=0 starts each worker on its own."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ravop as R
from ravop.client import session as sessions
from ravop.core.cpu_threads import per_worker
from ravop.core.errors import RavopError
from ravop.local import embedded, forked_workers

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 300.0


def _stat(pid):
    """(state, ppid) of `pid`, or None once it is gone or a zombie (it has exited, unreaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return None if fields[0] == "Z" else (fields[0], int(fields[1]))


def _wait_gone(pids, timeout=60):
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if _stat(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _children(parents):
    """(pid, comm) of the live processes whose parent is one of `parents`, from the process list."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        state = _stat(int(entry))
        if state and state[1] in parents:
            try:
                with open(f"/proc/{entry}/comm") as f:
                    found.append((int(entry), f.read().strip()))
            except FileNotFoundError:
                pass
    return found


def _ours(requester_pid, fork_server_pid):
    """The live fork server and workers of a requester (an orphaned worker comes back to pytest, a subreaper)."""
    return sorted(pid for pid, comm in _children({requester_pid, fork_server_pid, os.getpid()})
                  if comm in ("ravop-forks", "ravop-worker"))


@pytest.fixture
def fresh_session():
    """No embedded session left running from another test (it would be kept, with its settings)."""
    if sessions._session is not None:
        sessions._session.close()
        sessions._session = None
    threads = torch.get_num_threads()
    yield
    if sessions._session is not None:
        sessions._session.close()
        sessions._session = None
    torch.set_num_threads(threads)


def _first_result(name):
    R.Graph(name=name)
    ones = R.t(torch.ones(100, 100))
    (ones @ ones).persist_op(name)   # too big to fold into a constant: a worker computes it
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    return R.fetch_persisting_op(name)


@pytest.mark.parametrize("mode", ["auto", "spawn"])
def test_embedded_workers_are_forked_from_one_fork_server_run_graphs_and_stop_with_the_session(fresh_session,
                                                                                              monkeypatch, mode):
    """auto: forked from this process where that is safe (one thread per worker: 2 workers on 2 cores), else a
    fresh `python -m worker.serve.forkserver`; spawn: always the latter."""
    monkeypatch.setenv(forked_workers.FORK_SERVER_ENV, mode)
    assert forked_workers.available()
    here = mode == "auto" and forked_workers.can_fork_here(per_worker(2))   # before this session's own threads
    session = R.initialize(token=f"fork-server-{mode}", workers=2)
    cluster = session.embedded
    assert isinstance(cluster.forks.process, subprocess.Popen) is not here
    assert torch.equal(_first_result("forked"), torch.full((100, 100), 100.0))
    cluster.wait_ready(session.client, timeout=START_TIMEOUT)
    workers = [process.pid for _, _, process in cluster.workers]
    assert len(workers) == 2 and None not in workers
    assert _stat(cluster.forks.pid)[1] == os.getpid()
    with open(f"/proc/{cluster.forks.pid}/comm") as f:
        assert f.read().strip() == "ravop-forks"
    for pid in workers:
        assert _stat(pid)[1] == cluster.forks.pid   # forked by it, not started by the requester
        with open(f"/proc/{pid}/comm") as f:
            assert f.read().strip() == "ravop-worker"
    ran_by = set(session.client.hvals(sessions._current_keys().ran))
    assert ran_by and ran_by <= {name.encode() for name, _, _ in cluster.workers}
    server = cluster.server.process.pid
    assert _ours(os.getpid(), cluster.forks.pid) == sorted([cluster.forks.pid, *workers])

    session.close()
    sessions._session = None
    assert not _wait_gone([server, cluster.forks.pid, *workers])
    assert not _ours(os.getpid(), cluster.forks.pid)
    assert cluster.forks.process.poll() == 0   # it stopped its workers and exited


def test_a_worker_killed_on_the_fork_server_path_is_reported_by_name(fresh_session):
    session = R.initialize(token="fork-crash", workers=1)
    cluster = session.embedded
    cluster.wait_ready(session.client, timeout=START_TIMEOUT)
    name, _, process = cluster.workers[0]
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    with pytest.raises(RavopError, match=rf"embedded worker {name} was killed by SIGKILL"):
        cluster.check()


def test_a_worker_that_fails_to_start_says_why(tmp_path):
    cluster = embedded.EmbeddedCluster(workers=1, data=[[str(tmp_path / "missing.csv")]])
    try:
        process = cluster.workers[0][2]
        assert process.wait(timeout=START_TIMEOUT) == 1
        with pytest.raises(RavopError, match=r"(?s)embedded worker .* exited with code 1:.*ravop-worker: .*missing"):
            cluster.check()
        cluster.forks.process.poll()
        assert cluster.forks.process.returncode is None   # one worker's failure leaves the fork server serving
    finally:
        cluster.stop()
    assert cluster.forks.process.returncode == 0


def test_a_dead_fork_server_takes_its_workers_and_is_reported(fresh_session):
    session = R.initialize(token="fork-server-dies", workers=2)
    cluster = session.embedded
    cluster.wait_ready(session.client, timeout=START_TIMEOUT)
    workers = [process.pid for _, _, process in cluster.workers]
    cluster.forks.process.kill()
    assert not _wait_gone(workers)   # their parent-death signal
    with pytest.raises(RavopError, match=r"fork server .* was killed by SIGKILL, and its workers with it"):
        cluster.check()
    assert all(process.wait(timeout=60) is not None for _, _, process in cluster.workers)


def test_a_garbled_command_is_ignored_and_exits_are_reported(tmp_path):
    """The protocol itself: a line that is no command is logged and skipped; a worker's exit code comes back."""
    log = tmp_path / "fork-server.log"
    forks = embedded.start_fork_server(str(log))
    try:
        forks.process.stdin.write(b"not json\n{\"what\": 1}\n")
        forks.process.stdin.flush()
        worker = forks.fork(["--redis", "unix:///nonexistent", "--threads", "0"], str(tmp_path / "worker.log"))
        assert worker.wait(timeout=START_TIMEOUT) == 2
        assert "--threads must be at least 1" in (tmp_path / "worker.log").read_text()
        assert worker.pid is not None and not _stat(worker.pid)
        assert "ignored command b'not json'" in log.read_text()
        assert "ignored command b'{\"what\": 1}'" in log.read_text()
    finally:
        forks.stop()
    assert forks.process.returncode == 0


def test_without_the_fork_server_each_worker_is_its_own_process(fresh_session, monkeypatch):
    monkeypatch.setenv(forked_workers.FORK_SERVER_ENV, "0")
    assert not forked_workers.available()
    session = R.initialize(token="no-fork-server", workers=2)
    cluster = session.embedded
    assert cluster.forks is None
    assert torch.equal(_first_result("unforked"), torch.full((100, 100), 100.0))
    cluster.wait_ready(session.client, timeout=START_TIMEOUT)
    workers = [process.pid for _, _, process in cluster.workers]
    assert all(isinstance(process, subprocess.Popen) for _, _, process in cluster.workers)
    assert [_stat(pid)[1] for pid in workers] == [os.getpid()] * 2
    session.close()
    sessions._session = None
    assert not _wait_gone(workers)


KILLED_SCRIPT = """
import os
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])   # a 2-core share: 2 workers of one thread each
import torch, ravop as R
session = R.initialize(token="killed", workers=2)
cluster = session.embedded
R.Graph(name="killed")
ones = R.t(torch.ones(100, 100))
(ones @ ones).persist_op("product")
R.activate()
R.execute()
R.track_progress(progress_bar=False)
cluster.wait_ready(session.client)
print(cluster.server.process.pid, cluster.forks.pid, *[p.pid for _, _, p in cluster.workers], flush=True)
print(type(cluster.forks.process).__name__, float(R.fetch_persisting_op("product").sum()), flush=True)
import time; time.sleep(3600)
"""


def test_workers_forked_from_the_requester_run_graphs_and_a_sigkilled_requester_leaves_none_of_them():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAVOP_REDIS_URL", None)
    requester = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT], env=env, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in requester.stdout.readline().split()]
        assert len(pids) == 4, pids
        assert requester.stdout.readline().split() == ["_ChildHere", "1000000.0"]   # forked from it; computed
    finally:
        requester.kill()
        requester.wait()
    assert not _wait_gone(pids)
    assert not _ours(requester.pid, pids[1])


def test_the_fork_server_is_forked_from_the_requester_only_where_that_is_safe(monkeypatch):
    """One intra-op thread per CPU worker (OpenMP's pool would not survive the fork), no other thread here (it
    might hold a lock the child needs), and not told otherwise."""
    import threading
    monkeypatch.setenv(forked_workers.FORK_SERVER_ENV, "auto")
    other = threading.Event()
    helper = threading.Thread(target=other.wait)
    alone = threading.active_count() == 1
    assert forked_workers.can_fork_here(1) is alone
    assert not forked_workers.can_fork_here(2)
    assert not forked_workers.can_fork_here(1, "cuda")
    helper.start()
    try:
        assert not forked_workers.can_fork_here(1)
    finally:
        other.set()
        helper.join()
    monkeypatch.setenv(forked_workers.FORK_SERVER_ENV, "spawn")
    assert forked_workers.available() and not forked_workers.can_fork_here(1)
    for off in ("0", "off"):
        monkeypatch.setenv(forked_workers.FORK_SERVER_ENV, off)
        assert not forked_workers.available() and not forked_workers.can_fork_here(1)
