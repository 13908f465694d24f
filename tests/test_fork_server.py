"""The embedded workers' fork server (worker/forkserver.py, ravop/fork_server.py): workers forked from one process
that imported torch once run graphs, die with their session however it ends, and a crash on that path is
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
from ravop import embedded, fork_server
from ravop import session as sessions
from ravop.errors import RavopError

ROOT = Path(__file__).resolve().parents[1]
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


def _ours(requester_pid):
    """Every live fork server or forked worker of `requester_pid`, from the process list (they all run the
    fork server's command line, which names the requester)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            continue
        if b"worker.forkserver" in args and str(requester_pid).encode() in args and _stat(int(entry)):
            found.append(int(entry))
    return found


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


def test_embedded_workers_are_forked_from_one_fork_server_run_graphs_and_stop_with_the_session(fresh_session):
    assert fork_server.available()
    session = R.initialize(token="fork-server", workers=2)
    cluster = session.embedded
    assert cluster.forks is not None
    assert torch.equal(_first_result("forked"), torch.full((100, 100), 100.0))
    cluster.wait_ready(session.client, timeout=START_TIMEOUT)
    workers = [process.pid for _, _, process in cluster.workers]
    assert len(workers) == 2 and None not in workers
    assert _stat(cluster.forks.pid)[1] == os.getpid()
    for pid in workers:
        assert _stat(pid)[1] == cluster.forks.pid   # forked by it, not started by the requester
        with open(f"/proc/{pid}/comm") as f:
            assert f.read().strip() == "ravop-worker"
        with open(f"/proc/{pid}/environ", "rb") as f:
            assert b"OMP_WAIT_POLICY=PASSIVE" in f.read().split(b"\0")
    ran_by = set(session.client.hvals(sessions._current_keys().ran))
    assert ran_by <= {name.encode() for name, _, _ in cluster.workers} and ran_by
    server = cluster.server.process.pid
    assert sorted(_ours(os.getpid())) == sorted([cluster.forks.pid, *workers])

    session.close()
    sessions._session = None
    assert not _wait_gone([server, cluster.forks.pid, *workers])
    assert not _ours(os.getpid())
    assert all(process.poll() is not None for process in (cluster.forks.process,))


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
    monkeypatch.setenv(fork_server.FORK_SERVER_ENV, "0")
    assert not fork_server.available()
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
import ravop as R
session = R.initialize(token="killed", workers=2)
cluster = session.embedded
cluster.wait_ready(session.client)
print(cluster.server.process.pid, cluster.forks.pid, *[p.pid for _, _, p in cluster.workers], flush=True)
import time; time.sleep(3600)
"""


def test_a_sigkilled_requester_leaves_no_fork_server_and_no_worker():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAVOP_REDIS_URL", None)
    requester = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT], env=env, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in requester.stdout.readline().split()]
        assert len(pids) == 4, pids
    finally:
        requester.kill()
        requester.wait()
    assert not _wait_gone(pids)
    assert not _ours(requester.pid)
