"""Run only by test_no_leftover_processes.py, in a pytest subprocess that it interrupts (the name keeps the
suite from collecting it): a test that has everything a test can start running, then hangs. It writes each
pid it starts, then "ready", to the file named by $LEAK_REPORT."""
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A user's script on the embedded default: its own server and one worker, kept running.
REQUESTER = "import time, ravop as R; R.initialize(workers=1); print('up', flush=True); time.sleep(3600)"


def note(line):
    with open(os.environ["LEAK_REPORT"], "a") as report:
        report.write(line + "\n")


def test_hangs_with_a_server_workers_and_a_requester_running(server, workers):
    workers.start(1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAVOP_REDIS_URL", None)
    requester = subprocess.Popen([sys.executable, "-c", REQUESTER], env=env, stdout=subprocess.PIPE, text=True)
    note(f"requester {requester.pid}")
    assert requester.stdout.readline().startswith("up")
    note("ready")
    time.sleep(3600)
