"""Compile time per op at 10k, 100k and 1M recorded ops (target: <= 20 us/op, growing linearly).

The program is a realistic mix: steps of a small training-like loop with a matmul, two elementwise
branches that join, a reduction with params, a duplicated subexpression (CSE), an unused op (dead code),
a constant-only expression (folded until the per-compile folding budget is spent) and a persisted
value every few steps.

    python benchmarks/bench_compile.py            # 10k, 100k, 1M ops
    python benchmarks/bench_compile.py --quick    # 10k, 100k
"""
import argparse
import gc
import math
import time

import torch

import ravop as R
from compiler import compile_graph


def build(n_ops):
    graph = R.Graph(name=f"bench_compile_{n_ops}")
    torch.manual_seed(0)
    # Two independent models, 64x128 activations (above the folding limit, so the loop is compiled, not
    # folded). Their steps are light, so the partitioner groups them rather than paying a hop per branch.
    xs = [R.t(torch.randn(64, 128)) for _ in range(2)]
    ws = [R.t(torch.randn(128, 128) / 16) for _ in range(2)]
    step = 0
    while len(graph.nodes) < n_ops:
        for k in range(2):
            h = xs[k] @ ws[k]
            a = h.exp()
            b = h.exp() * h                           # h.exp() again: merged by CSE
            d = (a - b.square()) * 0.5
            s = d.sum(axis=1, keepdims=True)
            xs[k] = d / (s.abs() + 1.0)
            xs[k].neg()                               # never read: removed as dead code
            ws[k] = ws[k] + R.t([[0.0]]) * R.t([[0.0]])  # constant-only product: folded
            if step % 10 == 0:
                s.persist_op(f"s{k}_{step}")
        step += 1
    for k in range(2):
        xs[k].persist_op(f"x{k}")
    return graph


def measure(n_ops):
    graph = build(n_ops)
    gc.collect()
    start = time.perf_counter()
    compiled = compile_graph(graph)
    seconds = time.perf_counter() - start
    serialize_start = time.perf_counter()
    size = len(compiled.plan.SerializeToString())
    serialize = time.perf_counter() - serialize_start
    return len(graph.nodes), seconds, serialize, size, compiled.summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k and 100k ops only")
    args = parser.parse_args()
    sizes = (10_000, 100_000) if args.quick else (10_000, 100_000, 1_000_000)
    rows = [measure(n) for n in sizes]
    print(f"{'ops':>9} {'compile s':>10} {'us/op':>7} {'serialize us/op':>16} {'plan MB':>8} {'subgraphs':>10} "
          f"{'width':>6} {'dead':>6} {'cse':>6} {'folded':>7} {'chains':>7}")
    for n, seconds, serialize, size, s in rows:
        print(f"{n:>9} {seconds:>10.3f} {seconds / n * 1e6:>7.2f} {serialize / n * 1e6:>16.2f} {size / 1e6:>8.1f} "
              f"{s['subgraphs']:>10} {s['max_parallel_width']:>6} {s['dead_code_removed']:>6} "
              f"{s['cse_merged']:>6} {s['folded']:>7} {s['fused_chains']:>7}")
    (n0, t0, *_), (n1, t1, *_) = rows[0], rows[-1]
    exponent = math.log(t1 / t0) / math.log(n1 / n0)
    worst = max(seconds / n for n, seconds, *_ in rows)
    print(f"\ncompile time grows as ops^{exponent:.2f} from {n0:,} to {n1:,} ops (1.00 is linear, 2.00 quadratic)")
    print(f"slowest {worst * 1e6:.2f} us/op; target <= 20 us/op: {'met' if worst <= 20e-6 else 'missed'}")


if __name__ == "__main__":
    main()
