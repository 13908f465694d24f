"""Memory of training a PyTorch model through the engine as it grows, against eager PyTorch (issue 46), and the
seconds `R.model(module)` takes per size.

Each size is an MLP `Pytorch_Model(R.model(module))` trained a few steps by `.fit` with ravdl's Adam, after
`R.initialize()` (the embedded server and local workers), in a process of its own; the same model (same init,
same batches) trained by eager PyTorch with `torch.optim.Adam(fused=True)` on one thread, in another process of
the same run. A sampler reads the proportional set size (PSS, /proc/PID/smaps_rollup: a page shared by n
processes counts 1/n in each, so the sum over processes counts it once) of every process of a side every 50 ms:
the requester, the server, the fork server and the workers for the engine (and the requester's sealed memory files
that no process maps: memory in no PSS); the one process for eager. Printed per
size: the peak of that sum above each side's baseline (torch imported, the session started, before the model is
built), its bytes per parameter, the engine/eager ratio, each process's own peak, and R.model's seconds.

    python benchmarks/bench_model_memory.py                  # ~10M, ~40M, ~100M parameters
    python benchmarks/bench_model_memory.py --sizes 10,40 --steps 4
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

IN_FEATURES, CLASSES, DEPTH, BATCH = 256, 10, 4, 64


def sealed_file_bytes(pid):
    """The bytes of the sealed memory files (ravop.store.same_host) process `pid` holds open, each file once (a
    mapping of one holds a second descriptor)."""
    files = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:ravop-"):
                found = os.stat(f"/proc/{pid}/fd/{fd}")
                files[found.st_dev, found.st_ino] = found.st_size
        except OSError:   # closed meanwhile
            continue
    return sum(files.values())


def shmem_pss_bytes(pid):
    """The part of process `pid`'s PSS in shared memory (a worker's mappings of the requester's sealed files)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            return next((int(line.split()[1]) * 1024 for line in rollup if line.startswith("Pss_Shmem:")), 0)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0


def pss_bytes(pid):
    """The PSS of process `pid` in bytes, 0 for a process gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0
    raise RuntimeError("no Pss in /proc/PID/smaps_rollup (Linux 4.14+ only)")


UNMAPPED = "requester's files, unmapped"


def measure(pids, hidden):
    """role -> PSS of each process of `pids` (role -> pid); with `hidden` (a role's name), also the bytes of the
    first process's sealed memory files that no process maps (in no PSS, yet memory: the file of a constant the
    requester uploaded, ravop.store.same_host), estimated as those files' size less the processes' PSS in shared
    memory."""
    values = {role: pss_bytes(pid) for role, pid in pids.items()}
    if hidden is not None:
        first = next(iter(pids.values()))
        values[hidden] = max(0, sealed_file_bytes(first) - sum(shmem_pss_bytes(pid) for pid in pids.values()))
    return values


class Sampler:
    """Every `period` s, the PSS of each process `pids()` names (role -> pid): the peak of their sum, and each
    role's own peak."""

    def __init__(self, pids, period=0.05, hidden=None):
        self.pids, self.period, self.hidden = pids, period, hidden
        self.peak, self.own, self.at_peak = 0, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self):
        values = measure(self.pids(), self.hidden)
        if sum(values.values()) > self.peak:
            self.peak, self.at_peak = sum(values.values()), values
        for role, value in values.items():
            self.own[role] = max(self.own.get(role, 0), value)
        return sum(values.values())

    def _run(self):
        while not self._stop.wait(self.period):
            self.sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


def width_for(millions):
    """The hidden width h of an MLP 256-h-...-h-10 with DEPTH hidden layers of about `millions` M parameters."""
    a, b = DEPTH - 1, IN_FEATURES + CLASSES + DEPTH   # a*h^2 + b*h ~ params
    return int((-b + (b * b + 4 * a * millions * 1e6) ** 0.5) / (2 * a))


def make_model(width):
    import torch
    from torch import nn
    torch.manual_seed(0)
    layers = [nn.Linear(IN_FEATURES, width), nn.ReLU()]
    for _ in range(DEPTH - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, CLASSES))


def make_data(steps):
    import numpy as np
    rng = np.random.default_rng(0)
    X = rng.standard_normal((steps * BATCH, IN_FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, steps * BATCH).astype(np.int64)
    return X, y


def eager(width, steps):
    import torch
    torch.set_num_threads(1)
    X, y = make_data(steps)
    sampler = Sampler(lambda: {"eager": os.getpid()})
    base = sampler.sample()
    sampler.peak = 0
    with sampler:
        module = make_model(width)
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-3, fused=True)
        X, y = torch.from_numpy(X), torch.from_numpy(y)
        for step in range(steps):
            rows = slice(step * BATCH, (step + 1) * BATCH)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(module(X[rows]), y[rows])
            loss.backward()
            optimizer.step()
    return {"base": base, "peak": sampler.peak, "params": sum(p.numel() for p in module.parameters())}


def engine(width, steps, workers):
    import ravop as R
    from ravdl.v2 import Pytorch_Model
    from ravdl.v2.optimizers import Adam
    session = R.initialize(token="bench-model-memory", workers=workers)
    session.embedded.wait_ready(session.client)
    R.flush()
    X, y = make_data(steps)
    cluster = session.embedded

    def pids():
        found = {"requester": os.getpid(), "server": cluster.server.process.pid}
        if cluster.forks is not None:
            found["fork server"] = cluster.forks.pid
        found.update({f"worker {i}": process.pid for i, (_, _, process) in enumerate(cluster.workers)})
        return found

    sampler = Sampler(pids, hidden=UNMAPPED)
    base = sampler.sample()
    sampler.peak, sampler.own, sampler.at_peak = 0, {}, {}
    with sampler:
        module = make_model(width)
        phases = {"module": now(pids)}
        started = time.perf_counter()
        model = Pytorch_Model(R.model(module))
        model_seconds = time.perf_counter() - started
        phases["R.model"] = now(pids)
        model.initialize(Adam(lr=1e-3))
        R.Graph(name="bench model memory")
        model.fit(X, y, n_epochs=1, batch_size=BATCH, loss="CrossEntropy")
        phases["fit recorded"] = now(pids)
        R.activate()
        phases["activated"] = now(pids)
        R.execute()
        R.track_progress(progress_bar=False, timeout=3600)
        phases["ran"] = now(pids)
    return {"base": base, "peak": sampler.peak, "own": sampler.own, "at_peak": sampler.at_peak,
            "model_seconds": model_seconds, "params": sum(p.numel() for p in module.parameters()), "phases": phases}


def now(pids):
    """Each process's PSS at this moment, and the requester's unmapped sealed files (role -> bytes)."""
    return measure(pids(), UNMAPPED)


def run_side(side, millions, steps, workers):
    """One side's figures for one size, from a process of its own."""
    command = [sys.executable, __file__, "--side", side, "--sizes", str(millions), "--steps", str(steps),
               "--workers", str(workers)]
    # A data dir of its own: the embedded server would load the snapshot of earlier sessions of this user.
    with tempfile.TemporaryDirectory(prefix="bench-model-memory-") as data_dir:
        done = subprocess.run(command, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "RAVOP_DATA_DIR": data_dir})
    if done.returncode != 0:
        raise RuntimeError(f"{side} at {millions}M failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,40,100", help="millions of parameters, comma-separated")
    parser.add_argument("--steps", type=int, default=3, help="training steps (batches of 64 rows)")
    parser.add_argument("--workers", type=int, default=1, help="embedded workers (one runs the loop)")
    parser.add_argument("--phases", action="store_true", help="also print each engine process's PSS after each phase")
    parser.add_argument("--side", choices=("engine", "eager"), help=argparse.SUPPRESS)   # a child's one run
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    if args.side:
        width = width_for(sizes[0])
        result = engine(width, args.steps, args.workers) if args.side == "engine" else eager(width, args.steps)
        print(json.dumps(result))
        return
    mib = 2 ** 20
    print(f"MLP {IN_FEATURES}-h x{DEPTH}-{CLASSES}, {args.steps} steps of {BATCH} rows, Adam; engine: "
          f"Pytorch_Model(R.model(module)).fit, {args.workers} embedded worker(s); eager: Adam(fused=True), 1 thread. "
          "Peak PSS summed over each side's processes, above its baseline:")
    print(f"{'params':>8} {'engine MiB':>11} {'eager MiB':>10} {'ratio':>6} {'engine B/param':>15} "
          f"{'eager B/param':>14} {'R.model s':>10}  engine processes' own peaks (MiB)")
    for millions in sizes:
        eager_run = run_side("eager", millions, args.steps, args.workers)
        engine_run = run_side("engine", millions, args.steps, args.workers)
        params = engine_run["params"]
        grown = {side: run["peak"] - run["base"] for side, run in (("engine", engine_run), ("eager", eager_run))}
        own = ", ".join(f"{role} {value / mib:.0f}" for role, value in engine_run["own"].items())
        print(f"{params / 1e6:7.1f}M {grown['engine'] / mib:11.0f} {grown['eager'] / mib:10.0f} "
              f"{grown['engine'] / grown['eager']:5.2f}x {grown['engine'] / params:15.1f} {grown['eager'] / params:14.1f} "
              f"{engine_run['model_seconds']:10.2f}  {own}", flush=True)
        print(f"{'':9}at the peak      " + ", ".join(f"{role} {value / mib:.0f}"
                                                    for role, value in engine_run["at_peak"].items()))
        for phase, values in engine_run["phases"].items() if args.phases else ():
            print(f"{'':9}after {phase:<13}" + ", ".join(f"{role} {value / mib:.0f}" for role, value in values.items()))


if __name__ == "__main__":
    main()
