"""Nothing a test starts outlives the test run, however it ends: a run interrupted (Ctrl-C, SIGTERM), killed
(SIGKILL, when no Python code can clean up any more) or timed out (pytest-timeout) leaves no server, worker
or requester behind, nor the embedded server and workers of a requester it started (tests/process_reaper.py).
The embedded server itself dies with its requester even when it cannot save its snapshot."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import process_reaper
from helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]


def start_run(report, *options):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LEAK_REPORT": str(report)}
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options,
                             str(ROOT / "tests" / "leaking_run.py")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def noted(report):
    return report.read_text().split("\n") if report.exists() else []


def assert_all_gone(pids, what):
    """Every one of `pids` exits; reported with how long the last one took."""
    started = time.monotonic()
    wait_for(lambda: not any(process_reaper.alive(pid) for pid in pids), f"{what}: {pids} to exit", timeout=60)
    return time.monotonic() - started


# SIGINT: pytest's own teardown, then the reaper; SIGKILL: only the kernel's parent-death signals are left;
# SIGKILL of an xdist controller: its workers get SIGTERM from the kernel, the path SIGTERM of pytest takes.
@pytest.mark.parametrize("how, options", [(signal.SIGINT, ()), (signal.SIGKILL, ()), (signal.SIGKILL, ("-n", "2"))],
                         ids=["SIGINT", "SIGKILL", "SIGKILL-xdist"])
def test_an_interrupted_or_killed_run_leaves_no_process(tmp_path, how, options):
    report = tmp_path / "report"
    run = start_run(report, *options)
    wait_for(lambda: "ready" in noted(report) or run.poll() is not None, "the sample test to start everything",
             timeout=600)
    assert run.poll() is None, run.communicate()[0]
    started = process_reaper.descendants(run.pid)
    # the pytest run's server and worker, and the requester with its own server and worker (each server
    # behind its launcher, or already exec'd)
    assert len(started) >= 5, started
    run.send_signal(how)
    out = run.communicate(timeout=300)[0]
    if how == signal.SIGINT:
        assert "KeyboardInterrupt" in out, out[-3000:]
    else:
        assert run.returncode == -how, out[-3000:]
    took = assert_all_gone(started, f"the processes of a run ended by {how.name}")
    print(f"{len(started)} processes gone {took:.1f} s after pytest exited")  # shown with -s


def test_a_timed_out_test_leaves_no_process(tmp_path):
    report = tmp_path / "report"
    run = start_run(report, "--timeout", "30", "-o", "timeout_func_only=true")
    started = set()
    while run.poll() is None:  # everything started, until the timeout fires
        started.update(process_reaper.descendants(run.pid))
        time.sleep(0.05)
    out = run.stdout.read()
    assert run.returncode == 1 and "Timeout" in out, out[-3000:]
    requester = [int(line.split()[1]) for line in noted(report) if line.startswith("requester ")]
    assert requester and set(requester) <= started
    assert not [pid for pid in started if process_reaper.alive(pid)]  # gone before pytest exits


def test_the_embedded_server_dies_with_its_requester_even_when_it_cannot_save(tmp_path):
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAVOP_DATA_DIR": str(data)}
    env.pop("RAVOP_REDIS_URL", None)
    script = ("import time, ravop as R; session = R.initialize(workers=0); "
              "print(session.embedded.server.process.pid, flush=True); time.sleep(3600)")
    requester = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    server = int(requester.stdout.readline())
    shutil.rmtree(data)  # where it saves its snapshot when it stops: gone, as on a full disk it cannot write
    requester.kill()
    requester.wait()
    assert_all_gone([server], "the embedded server of a SIGKILLed requester")
