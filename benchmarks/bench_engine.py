"""The same graph of small torch ops three ways, in one run: this engine (embedded default, one worker),
eager PyTorch, and Dask's distributed local cluster with one task per op.

    python benchmarks/bench_engine.py [--ops 10000] [--chains 10] [--repeats 3]

Targets (issue 2): >= 20x faster than Dask, within 3x of eager PyTorch.
"""
import argparse
import operator
import time

import torch

import ravop as R

# (name, eager function, ravop function): small elementwise steps that keep values bounded.
STEPS = [
    ("mul", lambda x, y: x * y, lambda x, y: x * y),
    ("add", lambda x, y: x + y, lambda x, y: x + y),
    ("sub", lambda x, y: x - y, lambda x, y: x - y),
    ("tanh", lambda x, y: torch.tanh(x), lambda x, y: R.tanh(x)),
]


def chain_inputs(chains, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(size, size, generator=g), torch.rand(size, size, generator=g) * 0.1)
            for _ in range(chains)]


def run_eager(inputs, ops_per_chain):
    outs = []
    for x, y in inputs:
        for i in range(ops_per_chain):
            x = STEPS[i % len(STEPS)][1](x, y)
        outs.append(x)
    return outs


def run_engine(inputs, ops_per_chain):
    times = {}
    t0 = time.perf_counter()
    R.flush()
    R.Graph(name="bench_engine")
    for c, (x0, y0) in enumerate(inputs):
        x, y = R.t(x0), R.t(y0)
        for i in range(ops_per_chain):
            x = STEPS[i % len(STEPS)][2](x, y)
        x.persist_op(f"chain_{c}")
    t1 = time.perf_counter()
    summary = R.activate()
    t2 = time.perf_counter()
    R.execute()
    R.track_progress(progress_bar=False)
    t3 = time.perf_counter()
    outs = [R.fetch_persisting_op(f"chain_{c}") for c in range(len(inputs))]
    t4 = time.perf_counter()
    times.update(record=t1 - t0, compile_upload=t2 - t1, execute=t3 - t2, fetch=t4 - t3, total=t4 - t0)
    return outs, times, summary


def run_dask(client, inputs, ops_per_chain):
    """One dask task per op (the granularity this engine's users would otherwise get from a task scheduler)."""
    funcs = {"mul": operator.mul, "add": operator.add, "sub": operator.sub, "tanh": _tanh}
    dsk, outputs = {}, []
    for c, (x0, y0) in enumerate(inputs):
        dsk[("x", c, 0)], dsk[("y", c)] = x0, y0
        for i in range(ops_per_chain):
            dsk[("x", c, i + 1)] = (funcs[STEPS[i % len(STEPS)][0]], ("x", c, i), ("y", c))
        outputs.append(("x", c, ops_per_chain))
    return client.get(dsk, outputs)


def _tanh(x, y):
    return torch.tanh(x)


def best(fn, repeats):
    results, times = None, []
    for _ in range(repeats):
        t = time.perf_counter()
        results = fn()
        times.append(time.perf_counter() - t)
    return results, min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--chains", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-dask", action="store_true")
    args = parser.parse_args()
    per_chain = args.ops // args.chains
    inputs = chain_inputs(args.chains)

    R.initialize(workers=1)
    eager_out, eager_s = best(lambda: run_eager(inputs, per_chain), args.repeats)
    engine_runs = [run_engine(inputs, per_chain) for _ in range(args.repeats)]
    engine_out, engine_times, summary = min(engine_runs, key=lambda r: r[1]["total"])
    for a, b in zip(engine_out, eager_out):
        torch.testing.assert_close(a, b)

    rows = [("eager PyTorch", eager_s)]
    engine_s = engine_times["total"]
    rows.append(("ravop engine (1 worker)", engine_s))
    if not args.no_dask:
        from dask.distributed import Client, LocalCluster
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            dask_out, dask_s = best(lambda: run_dask(client, inputs, per_chain), max(1, args.repeats - 1))
        for a, b in zip(dask_out, eager_out):
            torch.testing.assert_close(a, b)
        rows.append(("dask distributed (1 task/op)", dask_s))

    n_ops = per_chain * args.chains
    print(f"\n{n_ops} small ops ({args.chains} chains x {per_chain}), best of {args.repeats}")
    print(f"{'engine':32} {'seconds':>9} {'us/op':>8}")
    for name, seconds in rows:
        print(f"{name:32} {seconds:9.4f} {seconds / n_ops * 1e6:8.1f}")
    print("\nengine phases: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in engine_times.items()))
    print(f"engine subgraphs: {summary}")
    print(f"\nengine / eager = {engine_s / eager_s:.2f}x (target <= 3x)")
    if not args.no_dask:
        print(f"dask / engine  = {dask_s / engine_s:.1f}x (target >= 20x)")


if __name__ == "__main__":
    main()
