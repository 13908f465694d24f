"""The embedded default as a user's script gets it: R.initialize() with no URL starts a private server and
local workers, runs the graph on them, and nothing outlives the script, even when it is SIGKILLed."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, torch, ravop as R
from ravop.client import session
R.initialize()
R.flush()
R.Graph(name='demo', algorithm='addition', approach='distributed')
c = R.t([1, 2, 3]) + R.t([4, 5, 6])
c.persist_op(name='c_output')
x = R.t(torch.ones(100, 100))
(x @ x).persist_op('on_a_worker')
print(R.activate())
R.execute()
R.track_progress()
print('c_output:', R.fetch_persisting_op(op_name='c_output').tolist())
print('on_a_worker:', float(R.fetch_persisting_op('on_a_worker').sum()))
cluster = session._session.embedded
cluster.wait_ready(session._client())   # the second worker starts once the first has registered
print('ran by:', sorted(set(session._client().hvals(session._current_keys().ran))))
print('pids:', cluster.server.process.pid, *[p.pid for _, _, p in cluster.workers], flush=True)
print('dir:', cluster.server.dir, flush=True)
if os.environ.get('KILL_MYSELF'):
    os.kill(os.getpid(), 9)
"""


def run_script(**env):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAVOP_WORKERS": "2", **env}
    env.pop("RAVOP_REDIS_URL", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    return done, lines


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # an unreaped orphan has exited too
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout=60):
    deadline = time.monotonic() + timeout
    while [pid for pid in pids if running(pid)]:
        if time.monotonic() > deadline:
            return [pid for pid in pids if running(pid)]
        time.sleep(0.1)
    return []


def test_embedded_default_runs_the_example_and_stops_everything_at_exit():
    done, lines = run_script()
    assert done.returncode == 0, done.stderr[-3000:]
    assert lines["c_output"] == "[5, 7, 9]"
    assert float(lines["on_a_worker"]) == 100.0 * 100 * 100
    assert lines["ran by"].startswith("[b'embedded-")
    pids = [int(p) for p in lines["pids"].split()]
    assert len(pids) == 3  # the server and two workers
    assert wait_gone(pids) == []
    assert not os.path.exists(lines["dir"])


def test_embedded_server_and_workers_die_with_a_killed_requester():
    done, lines = run_script(KILL_MYSELF="1")
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    pids = [int(p) for p in lines["pids"].split()]
    try:
        assert wait_gone(pids) == []
    finally:
        shutil.rmtree(lines["dir"], ignore_errors=True)  # atexit never ran: nobody else removes it
