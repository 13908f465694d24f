"""The thread policy: workers sharing a machine never run more torch threads than it has cores. The embedded
default's N workers each run cores // N (at least 1), as they advertise in the store; the requester then runs
no more than one of them (it would compete with its own workers, and only the same thread count reproduces
their sums in eager PyTorch); worker processes wait passively in OpenMP; `ravop-worker` alone takes the
machine's cores and says so in its start line. Real embedded server and worker processes."""
import os
import subprocess
import sys
import time

import pytest
import torch

import ravop as R
from ravop.client import session as sessions
from ravop.client.session import live_workers
from ravop.core.cpu_threads import machine_cores, passive_waiting, per_worker
from ravop.local.embedded import _ROOT

from conftest import START_TIMEOUT


def test_workers_split_the_cores_and_never_get_none():
    assert per_worker(2, cores=2) == 1
    assert per_worker(2, cores=8) == 4
    assert per_worker(3, cores=8) == 2
    assert per_worker(4, cores=2) == 1      # more workers than cores: one thread each, not zero
    assert per_worker(0, cores=6) == 6      # no workers: nothing to split
    assert per_worker(1) == machine_cores() >= 1


def test_openmp_is_told_to_wait_passively_unless_the_user_said_otherwise():
    assert passive_waiting({})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert passive_waiting({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"


def _advertised(session):
    """The advertisements of the session's embedded workers, once all have registered (a stopped session's
    may linger in the snapshot the server loaded until their heartbeat's key expires: not counted). The workers
    after the first start once it has registered."""
    session.embedded.wait_ready(session.client, timeout=START_TIMEOUT)
    names = {name for name, _, _ in session.embedded.workers}
    deadline = time.monotonic() + START_TIMEOUT
    while len(workers := [w for w in live_workers() if w["name"] in names]) < len(names):
        assert time.monotonic() < deadline, f"only {len(workers)} of {len(names)} embedded workers registered"
        time.sleep(0.05)
    return workers


@pytest.mark.parametrize("count", [1, 2, 3])
def test_embedded_workers_run_their_share_of_the_cores(count):
    if sessions._session is not None:   # an embedded one left running would be kept, with its worker count
        sessions._session.close()
        sessions._session = None
    threads_before = torch.get_num_threads()
    session = R.initialize(token=f"threads-{count}", workers=count)
    try:
        share = per_worker(count)
        advertised = _advertised(session)
        assert sorted(w["threads"] for w in advertised) == [share] * count
        assert sum(w["threads"] for w in advertised) <= max(machine_cores(), count)
        assert torch.get_num_threads() == min(threads_before, share)
        for _, log, process in session.embedded.workers:
            with open(log) as f:   # its start line, as the worker sees its environment
                assert "OMP_WAIT_POLICY=PASSIVE)" in f.read()
            if share > 1:   # OpenMP reads it when torch loads: in the environment the process (or, if it was
                # forked from one, its fork server) started with. Workers of one thread never wait in OpenMP,
                # and only those may be forked from the requester (ravop/local/forked_workers.py).
                with open(f"/proc/{process.pid}/environ", "rb") as f:
                    assert b"OMP_WAIT_POLICY=PASSIVE" in f.read().split(b"\0")
    finally:
        session.close()
        sessions._session = None
        torch.set_num_threads(threads_before)


def test_a_lone_worker_takes_the_machines_cores_and_says_so(server, tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "worker", "--redis", server.url, "--name", "lone"],
                                   env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        R.initialize(token="lone", redis_url=server.url)
        deadline = time.monotonic() + START_TIMEOUT
        while not [w for w in live_workers() if w["name"] == "lone"]:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        [lone] = [w for w in live_workers() if w["name"] == "lone"]
        assert lone["threads"] == machine_cores()
        cores = machine_cores()
        start_line = log.read_text()
        assert f"with {cores} torch thread" in start_line and f"of {cores} cores" in start_line
        assert "OMP_WAIT_POLICY=PASSIVE" in start_line
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_a_worker_refuses_zero_threads(server):
    result = subprocess.run([sys.executable, "-m", "worker", "--redis", server.url, "--threads", "0"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "--threads must be at least 1" in result.stderr
