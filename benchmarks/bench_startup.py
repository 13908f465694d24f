"""Start-up: seconds from `R.initialize()` (the embedded default: a private server and 2 local workers) to the
first result of a trivial graph that a worker computes (a 100x100 matmul, fetched), each run in a fresh
process, on the machine as it is and then with two busy processes sharing its cores (as bench_contention.py
makes them). Also printed per run: when R.initialize() returned and when the first and the last worker had
registered. Target (issue 29): <= 3 s.

    python benchmarks/bench_startup.py [--runs 5] [--workers 2]

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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_contention import busy_processes, load  # noqa: E402

_ONE_RUN = """
import json, sys, time
import torch
import ravop as R
from ravop import session
from ravop.store import workers as liveness
workers = json.loads(sys.argv[1])
start, wall_start = time.perf_counter(), time.time()
R.initialize(token="bench-startup", workers=workers)
initialized = time.perf_counter() - start
client, registered = session.require().client, {}
R.Graph(name="first")
ones = R.t(torch.ones(100, 100))
(ones @ ones).persist_op("first")   # too big to fold into a constant at R.activate: a worker computes it
R.activate()
R.execute()
R.track_progress(progress_bar=False)
R.fetch_persisting_op("first")
first = time.perf_counter() - start
while len(registered) < (workers or 2):   # when each worker registered, as the workers themselves say
    for info in R.session.live_workers():
        registered.setdefault(info["name"], info["started"])
    time.sleep(0.01)
print(json.dumps({"initialize": initialized, "first": first, "wall_start": wall_start,
                  "registered": sorted(registered.values())}))
"""


def one_run(workers):
    """{initialize, first, registered: [s after R.initialize()]} of a fresh requester process."""
    env = dict(os.environ, RAVOP_DATA_DIR=os.path.join(os.environ.get("TMPDIR", "/tmp"), "ravop-bench-startup"))
    out = subprocess.run([sys.executable, "-c", _ONE_RUN, json.dumps(workers)], env=env, capture_output=True,
                         text=True, check=True).stdout
    run = json.loads(out.strip().splitlines()[-1])
    run["registered"] = [when - run["wall_start"] for when in run["registered"]]
    return run


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
    args = parser.parse_args()
    import torch
    print(f"{os.cpu_count()} cores, torch {torch.__version__}", flush=True)
    print(f"as the machine is ({load()})", flush=True)
    report("  quiet", [one_run(args.workers) for _ in range(args.runs)])
    with busy_processes():
        print(f"with two busy processes ({load()})", flush=True)
        report("  busy", [one_run(args.workers) for _ in range(args.runs)])


if __name__ == "__main__":
    main()
