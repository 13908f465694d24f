"""Start-up: seconds from `R.initialize()` (the embedded default: a private server and 2 local workers) to the
first result of a trivial graph that a worker computes (a 100x100 matmul, fetched), each run in a fresh
process, on the machine as it is and then with two busy processes sharing its cores (benchmarks/busy.py, as in
bench_contention.py). Also printed per run: when R.initialize() returned and when each worker had registered.
Target (issue 29): <= 3 s.

Each run is repeated for each way of starting the workers ($RAVOP_FORK_SERVER, ravop/local/forked_workers.py), the ways
interleaved run by run: 0 = each worker its own process (as before the fork server), spawn = a fresh fork
server that imports torch once, auto = the default (forked from the requester where that is safe).

    python benchmarks/bench_startup.py [--runs 5] [--workers 2] [--modes 0,spawn,auto]

The requester's own `import ravop` (and torch) is not counted: it happens before R.initialize() is called.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import ravop as R
from ravop.client import session as sessions

sys.path.insert(0, str(Path(__file__).resolve().parent))

from busy import busy_processes, load  # noqa: E402


def first_result(token, workers=None):
    """{initialize, first}: seconds from R.initialize() until it returned and until the first result."""
    start = time.perf_counter()
    R.initialize(token=token, workers=workers)
    initialized = time.perf_counter() - start
    R.Graph(name="first")
    ones = R.t(torch.ones(100, 100))
    (ones @ ones).persist_op("first")   # too big to fold into a constant at R.activate: a worker computes it
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    R.fetch_persisting_op("first")
    return {"initialize": initialized, "first": time.perf_counter() - start}


def _child(workers):
    """One run in this fresh process; prints its figures as JSON (worker registrations as seconds after start)."""
    wall_start = time.time()
    run = first_result("bench-startup", workers)
    registered = {}
    while len(registered) < (2 if workers is None else workers):   # as the workers themselves say
        for info in sessions.live_workers():
            registered.setdefault(info["name"], info["started"] - wall_start)
        time.sleep(0.01)
    print(json.dumps({**run, "registered": sorted(registered.values())}))


def one_run(workers, mode):
    """{initialize, first, registered} of a fresh requester process, its workers started the `mode` way."""
    env = dict(os.environ, RAVOP_DATA_DIR=os.path.join(os.environ.get("TMPDIR", "/tmp"), "ravop-bench-startup"),
               RAVOP_FORK_SERVER=mode)
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(workers)], env=env, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def report(label, runs):
    first = [run["first"] for run in runs]
    print(f"{label}: R.initialize() to first result, median {statistics.median(first):.2f} s "
          f"(runs: {', '.join(f'{s:.2f}' for s in first)})")
    for run in runs:
        print(f"    initialize returned {run['initialize']:.2f} s, workers registered "
              f"{', '.join(f'{s:.2f}' for s in run['registered'])} s, first result {run['first']:.2f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=None, help="embedded workers (default: R.initialize's)")
    parser.add_argument("--modes", default="0,spawn,auto", help="$RAVOP_FORK_SERVER values to compare")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)   # one run, in a fresh process
    args = parser.parse_args()
    if args.child is not None:
        return _child(json.loads(args.child))
    modes = args.modes.split(",")
    print(f"{os.cpu_count()} cores, torch {torch.__version__}", flush=True)

    def rounds(label):
        runs = {mode: [] for mode in modes}
        for _ in range(args.runs):
            for mode in modes:
                runs[mode].append(one_run(args.workers, mode))
        for mode in modes:
            report(f"  {label}, RAVOP_FORK_SERVER={mode}", runs[mode])

    print(f"as the machine is ({load()})", flush=True)
    rounds("quiet")
    print(f"  ({load()} at the end)", flush=True)
    with busy_processes():
        print(f"with two busy processes ({load()})", flush=True)
        rounds("busy")
        print(f"  ({load()} at the end)", flush=True)


if __name__ == "__main__":
    main()
