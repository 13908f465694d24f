"""Training that outlives its providers (issue 43): 3 worker processes, one SIGKILLed every `--period` seconds
(slots in turn: each slot fails about once every 3 periods) and replaced by a new process, for a plain fit and a
resident DiLoCo(3) fit of the MNIST-sized MLP of bench_ravdl.py. Each fit runs undisturbed first, then disturbed,
on the same server; goodput = undisturbed wall / disturbed wall, and the disturbed run's batch losses and
prediction (1000 rows, through the trained parameters) are compared bit for bit with the undisturbed run's.

    python benchmarks/bench_churn.py [--rows 12000] [--epochs 10] [--diloco-epochs 10] [--inner-steps 16]
                                     [--period 20] [--same-name] [--fits plain,diloco] [--dead-after 3]
                                     [--checkpoint-seconds 1] [--resident-checkpoint-seconds 2]
                                     [--emulate-device-flops 2e10]

`--same-name`: a replacement takes the name of the worker it replaces (as systemd restarts a unit), which takes
what its predecessor held at once (worker/serve/takeover.py `predecessor`). The worker settings are passed to
every worker (defaults: the worker's own). Each kill, replacement and takeover is logged with its time.
"""
import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ravop as R  # noqa: E402
from bench_ravdl import GRAPH_SEED, mnist_data, mnist_weights, record_mnist  # noqa: E402
from ravop.local.embedded import LocalServer, start_worker  # noqa: E402
from ravop.record.graph import current_graph  # noqa: E402
from ravop.store import connect  # noqa: E402
from ravop.store.keys import worker_key  # noqa: E402

TOKEN = "bench-churn"


class Fleet:
    """`size` workers in slots; `kill_next()` SIGKILLs the oldest slot's worker and starts its replacement."""

    def __init__(self, url, size, extra, log_dir, same_name):
        self.url, self.extra, self.log_dir, self.same_name = url, extra, log_dir, same_name
        self.client = connect(url)
        self.slots = [self._start(f"churn-{uuid.uuid4().hex[:6]}") for _ in range(size)]
        self.turn = 0
        self.kills = []   # (seconds since the fit started, the killed worker)
        for name, _ in self.slots:
            self._wait(name)

    def _start(self, name):
        log_path = os.path.join(self.log_dir, f"{name}.log")
        return name, start_worker(self.url, name, "cpu", threads=1, log_path=log_path, extra_args=self.extra)

    def _wait(self, name):
        while not self.client.exists(worker_key(name)):
            time.sleep(0.05)

    def kill_next(self, since):
        name, proc = self.slots[self.turn]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.kills.append((time.perf_counter() - since, name))
        self.slots[self.turn] = self._start(name if self.same_name else f"churn-{uuid.uuid4().hex[:6]}")
        self.turn = (self.turn + 1) % len(self.slots)

    def stop(self):
        for _, proc in self.slots:
            proc.terminate()
        for _, proc in self.slots:
            proc.wait()
        self.client.close()


def run_fit(data, epochs, strategy, fleet=None, period=None):
    """(seconds from R.execute until the graph is done, {name: tensor}); with `fleet`, a worker SIGKILLed every
    `period` s (jittered +-20%) until the graph ends."""
    X, y, weights = data
    R.flush()
    R.Graph(name="churn fit", seed=GRAPH_SEED)
    model = record_mnist(epochs, X, y, weights, strategy=strategy)
    model.predict(X[:1000]).persist_op("prediction")
    names = list(current_graph().step_outputs) + ["prediction"]
    R.activate()
    done = threading.Event()
    start = time.perf_counter()
    R.execute()
    killer = None
    if fleet is not None:
        def kill_periodically():
            while not done.wait(period * random.uniform(0.8, 1.2)):
                fleet.kill_next(start)
        killer = threading.Thread(target=kill_periodically, daemon=True)
        killer.start()
    try:
        R.track_progress(progress_bar=False, timeout=3600)
    except R.GraphFailedError as exc:   # reported as the row's result
        return time.perf_counter() - start, str(exc)
    finally:
        done.set()
        if killer is not None:
            killer.join()
    wall = time.perf_counter() - start
    return wall, {name: R.fetch_persisting_op(name) for name in names}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=12_000)
    parser.add_argument("--epochs", type=int, default=10, help="the plain fit's epochs")
    parser.add_argument("--diloco-epochs", type=int, default=10)
    parser.add_argument("--inner-steps", type=int, default=16, help="DiLoCo(3)'s inner steps per round")
    parser.add_argument("--period", type=float, default=20.0, help="seconds between kills")
    parser.add_argument("--same-name", action="store_true", help="replacements take the killed worker's name")
    parser.add_argument("--fits", default="plain,diloco")
    parser.add_argument("--dead-after", type=float, default=None)
    parser.add_argument("--checkpoint-seconds", type=float, default=None)
    parser.add_argument("--resident-checkpoint-seconds", type=float, default=None)
    parser.add_argument("--emulate-device-flops", type=float, default=None,
                        help="workers act as devices of this many FLOP/s (steps paced, not computed faster): steps "
                             "of a known length on a machine shared with other work")
    parser.add_argument("--seed", type=int, default=0, help="of the kills' jitter")
    args = parser.parse_args()
    fits = args.fits.split(",")
    unknown = set(fits) - {"plain", "diloco"}
    if unknown:
        parser.error(f"--fits takes plain and diloco, not {', '.join(sorted(unknown))}")
    random.seed(args.seed)
    torch.set_num_threads(1)
    extra = ["--max-attempts", "3"]
    for flag, value in (("--dead-after", args.dead_after), ("--checkpoint-seconds", args.checkpoint_seconds),
                        ("--resident-checkpoint-seconds", args.resident_checkpoint_seconds),
                        ("--emulate-device-flops", args.emulate_device_flops)):
        if value is not None:
            extra += [flag, repr(value)]
    X, y = mnist_data(args.rows)
    data = (X, y, mnist_weights())
    server = LocalServer()
    log_dir = tempfile.mkdtemp(prefix="bench-churn-")
    rows = []
    try:
        R.initialize(token=TOKEN, redis_url=server.url)
        for fit in fits:
            strategy = R.parallel.DiLoCo(3, args.inner_steps, resident=True) if fit == "diloco" else None
            epochs = args.diloco_epochs if fit == "diloco" else args.epochs
            fleet = Fleet(server.url, 3, extra, log_dir, args.same_name)
            try:
                calm, want = run_fit(data, epochs, strategy)
            finally:
                fleet.stop()
            fleet = Fleet(server.url, 3, extra, log_dir, args.same_name)
            try:
                churned, got = run_fit(data, epochs, strategy, fleet, args.period)
            finally:
                fleet.stop()
            same = isinstance(got, dict) and \
                all(torch.equal(torch.as_tensor(got[name]), torch.as_tensor(value)) for name, value in want.items())
            rows.append((fit, epochs, calm, churned, len(fleet.kills), same if isinstance(got, dict) else got,
                         len(want)))
            print(f"{fit}: undisturbed {calm:.1f} s, disturbed {churned:.1f} s, same bits {rows[-1][5]}; kills at "
                  + ", ".join(f"{t:.1f} s" for t, _ in fleet.kills), flush=True)
    finally:
        server.stop()
    settings = " ".join(extra)
    print(f"churn: MNIST-sized MLP, {args.rows} rows, 3 workers (1 thread each), one SIGKILLed every "
          f"~{args.period:g} s and replaced{' under its name' if args.same_name else ''}; workers: {settings}; "
          f"logs in {log_dir}")
    print(f"{'fit':<22}{'undisturbed s':>14}{'disturbed s':>13}{'kills':>7}{'goodput':>9}  same bits")
    for fit, epochs, calm, churned, kills, same, n in rows:
        label = f"{fit} ({epochs} epochs)" if fit == "plain" else f"DiLoCo(3, {args.inner_steps}) ({epochs} ep.)"
        result = f"{same} ({n} values)" if isinstance(same, bool) else f"failed: {same}"
        print(f"{label:<22}{calm:>14.1f}{churned:>13.1f}{kills:>7}{calm / churned:>9.2f}  {result}")


if __name__ == "__main__":
    main()
