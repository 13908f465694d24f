"""The reproducible numerics mode's cost, in one run: the digits MLP and CNN (5 epochs, batch 32, as
benchmarks/bench_contention.py) and the MNIST-sized MLP (1 epoch, batch 128, benchmarks/bench_ravdl.py) fitted end to
end on one worker with the default kernels, on one worker with `--numerics reproducible`, and in eager PyTorch, the
three taking turns; prints each one's best time and the ratios (target: the mode <= 1.5x the default kernels), then
where the time goes, op by op, in one loop of each model run in this process with each kind of kernels
(benchmarks/bench_step.py's profile).

    python benchmarks/bench_reproducible.py [--repeats 3] [--threads 1] [--no-profile]
    python benchmarks/bench_reproducible.py --table    # op x CPU class x threads -> identical, as markdown

`--table` runs benchmarks/reproducible_probe.py under the three emulated CPU classes (avx2: this machine; avx,
sse4: their libraries' variables, tests/ops/test_reproducible_numerics.py) on 1 and 2 threads and prints, per op, whether
the mode's bits and the default kernels' bits agree on all six runs.
"""
import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
sys.path.insert(0, str(HERE))

import bench_contention  # noqa: E402
import bench_ravdl  # noqa: E402
import bench_step  # noqa: E402
import reproducible_probe  # noqa: E402
import ravop as R  # noqa: E402
from example_data import digits_data  # noqa: E402
from ravop.core import numerics_mode, registry  # noqa: E402
from ravop.local.embedded import LocalServer, start_worker, worker_environment  # noqa: E402
from ravop.runtime.loop_run import LoopRun  # noqa: E402
from ravop.store import connect  # noqa: E402
from ravop.store.keys import worker_key  # noqa: E402

CLASSES = {"avx2": {},
           "avx": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AVX", "ONEDNN_MAX_CPU_ISA": "AVX"},
           "sse4": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}}


def cases():
    """(label, record on the engine, eager seconds) of the three fits."""
    X, _, y, _ = digits_data()
    Xm, ym = bench_ravdl.mnist_data()
    weights = bench_ravdl.mnist_weights()
    return [("digits MLP", lambda: bench_contention.record_mlp(5, 32, X, y),
             lambda: bench_contention.eager_fit(bench_contention.eager_mlp, 5, 32, X, y)),
            ("digits CNN", lambda: bench_contention.record_cnn(5, 32, X, y),
             lambda: bench_contention.eager_fit(bench_contention.eager_cnn, 5, 32, X, y)),
            ("MNIST MLP", lambda: bench_ravdl.record_mnist(1, Xm, ym, weights),
             lambda: bench_ravdl.eager_mnist(1, Xm, ym, weights)[0])]


def one_worker(url, numerics, threads):
    """A worker of `numerics` on the benchmark's server, registered."""
    name = f"bench-{numerics}-{uuid.uuid4().hex[:6]}"
    proc = start_worker(url, name, "cpu", threads=threads, extra_args=["--numerics", numerics])
    client = connect(url)
    while not client.exists(worker_key(name)):
        if proc.poll() is not None:
            raise RuntimeError(f"worker {name} exited at start")
        time.sleep(0.05)
    client.close()
    return proc


def fits(url, numerics, threads, records):
    """label -> (seconds, losses) of each fit on one worker of `numerics`."""
    proc = one_worker(url, numerics, threads)
    try:
        return {label: bench_ravdl.engine(f"{label}-{numerics}", record) for label, record in records}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def profile(label, record, numerics):
    """The op-by-op profile of one loop of `record` with `numerics`' kernels, in this process."""
    os.environ[numerics_mode.ENV] = numerics
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            spec, inputs, seed = bench_step.recorded_loop(record)
        with torch.no_grad():
            bench_step.profile(LoopRun(spec, inputs, seed, decisions=bench_step.Always()), f"{label}, {numerics}")
    finally:
        del os.environ[numerics_mode.ENV]


def timings(args):
    torch.set_num_threads(args.threads)
    server = LocalServer()
    modes = (numerics_mode.DEFAULT, numerics_mode.REPRODUCIBLE)
    try:
        R.initialize(token="bench-reproducible", redis_url=server.url)
        table = cases()
        records = [(label, record) for label, record, _ in table]
        runs = {mode: [] for mode in modes}
        eager = {label: [] for label, _, _ in table}
        for _ in range(args.repeats):   # the sides take turns: a shared machine's load falls on both alike
            for mode in modes:
                runs[mode].append(fits(server.url, mode, args.threads, records))
            for label, _, run in table:
                eager[label].append(run())
    finally:
        server.stop()
    best = {mode: {label: min(r[label][0]["total"] for r in runs[mode]) for label, _, _ in table} for mode in modes}
    print(f"load average {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} cores)")
    print(f"{'case':<12}{'eager s':>9}{'default s':>11}{'mode s':>9}{'mode/default':>14}{'mode/eager':>12}"
          f"{'default/eager':>15}{'loss gap':>10}")
    for label, _, _ in table:
        d, m, e = best[modes[0]][label], best[modes[1]][label], min(eager[label])
        gap = float((runs[modes[0]][0][label][2] - runs[modes[1]][0][label][2]).abs().max())
        print(f"{label:<12}{e:>9.3f}{d:>11.3f}{m:>9.3f}{m / d:>14.2f}{m / e:>12.2f}{d / e:>15.2f}{gap:>10.1e}",
              flush=True)
    if args.profile:
        for label, record, _ in table:
            for mode in modes:
                profile(label, record, mode)


def table(args):
    """op -> per run whether its cases' bits agree, as markdown."""
    runs = [(name, threads) for name in CLASSES for threads in (1, 2)]
    with tempfile.TemporaryDirectory() as folder:
        inputs = os.path.join(folder, "inputs.npz")
        reproducible_probe.write_inputs(inputs)
        results = {}
        for name, threads in runs:
            env = {k: v for k, v in worker_environment().items() if k not in CLASSES["sse4"]}
            env.update(CLASSES[name], **{numerics_mode.ENV: numerics_mode.REPRODUCIBLE})
            done = subprocess.run([sys.executable, str(HERE / "reproducible_probe.py"), inputs, str(threads)],
                                  env=env, capture_output=True, text=True, check=True)
            results[(name, threads)] = json.loads(done.stdout)
    first = results[runs[0]]
    by_op = {}
    for case in first:
        if case != "_class":
            by_op.setdefault(case.rsplit("-", 1)[0], []).append(case)
    print("| op | cases | mode: same bits on " + ", ".join(f"{n}/{t}" for n, t in runs) +
          " | default kernels: same bits | way |")
    print("|---|---|---|---|---|")
    for op in sorted(by_op):
        same_mode = all(len({results[r][c].get("mode", "error") for r in runs}) == 1 and "error" not in first[c]
                        for c in by_op[op])
        same_default = all(len({results[r][c].get("default") for r in runs}) == 1 for c in by_op[op])
        way = "own kernel (order-free)" if registry.get(op).reproducible is registry.get(op).kernel else \
            "exact sums/products or composed"
        print(f"| {op} | {len(by_op[op])} | {'identical' if same_mode else 'DIFFERS'} | "
              f"{'identical' if same_default else 'differs'} | {way} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    (table if args.table else timings)(args)


if __name__ == "__main__":
    main()
