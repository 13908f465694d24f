"""`R.Graph(strategy=...)` over a hand-written training loop (compiler/passes/strategy.py), on 1 and 2 worker
processes, against the same loop in eager PyTorch, in one run: an MLP 784-256-10 (relu, cross entropy, Adam) of raw
ops, one `R.t` batch of 128 rows per step, on synthetic MNIST-shaped data.

    python benchmarks/bench_strategy_loops.py [--steps 66] [--threads 1] [--repeats 1]

Rows: eager PyTorch (one process); the loop without a strategy on 1 worker (folded, one loop op); LocalSGD(2,
sync_every=8) and DiLoCo(2, inner_steps=8, compression='int8') over it on 1 and 2 workers (resident replicas:
on one worker they take turns). Seconds run from R.execute until the graph is done; samples/s counts every
step's batch once (the replicas share the steps); "vs eager" is eager's seconds over the row's. Then the plan's
size for `--steps` and twice as many steps: the subgraphs do not change; the compiled ops grow by one per step
without a strategy too (each batch's transpose for W1's gradient, a large constant expression left to the
workers), and the strategy adds the same number of ops whatever the steps.
"""
import argparse
import contextlib
import itertools
import sys
import time
import uuid
from pathlib import Path

import torch
import torch.nn.functional as TF

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ravop as R  # noqa: E402
from bench_ravdl import Workers, mnist_data  # noqa: E402
from ravop.client.graph_kinds import compile_planned  # noqa: E402
from ravop.local.embedded import LocalServer  # noqa: E402
from ravop.record.graph import current_graph  # noqa: E402

BATCH, LR = 128, 0.001


def initial():
    torch.manual_seed(0)
    first, second = torch.nn.Linear(784, 256), torch.nn.Linear(256, 10)
    return [first.weight.detach().T.contiguous(), first.bias.detach(), second.weight.detach().T.contiguous(),
            second.bias.detach()]


def hand_written(X, y, steps, strategy):
    """Record the user's loop: per step its batch, the forward, R.grad and an Adam step per parameter."""
    R.Graph(name=f"hand-written {strategy!r}", seed=0, strategy=strategy)
    params = [R.t(p) for p in initial()]
    states = [[R.t(torch.zeros(p.shape)) for _ in range(3)] for p in params]
    for s in range(steps):
        rows = slice(s * BATCH, (s + 1) * BATCH)
        W1, b1, W2, b2 = params
        logits = R.matmul(R.relu(R.matmul(R.t(X[rows]), W1) + b1), W2) + b2
        loss = R.cross_entropy_loss(R.t(y[rows]), logits)
        for k, (p, g) in enumerate(zip(params, R.grad(loss, params))):
            params[k], *states[k] = R.adam_step(p, g, *states[k], step=s + 1, lr=LR)
        loss.persist_op(f"loss_{s}")
    params[0].persist_op("W1")


def eager(X, y, steps):
    params = [p.clone().requires_grad_() for p in initial()]
    opt = torch.optim.Adam(params, lr=LR)
    X, y = torch.from_numpy(X), torch.from_numpy(y)
    start = time.perf_counter()
    for s in range(steps):
        rows = slice(s * BATCH, (s + 1) * BATCH)
        W1, b1, W2, b2 = params
        loss = TF.cross_entropy(torch.relu(X[rows] @ W1 + b1) @ W2 + b2, y[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - start


def engine(X, y, steps, strategy):
    """(execute seconds, summary) of the loop on the running workers."""
    R.flush()
    hand_written(X, y, steps, strategy)
    summary = R.activate()
    start = time.perf_counter()
    R.execute()
    R.track_progress(progress_bar=False)
    seconds = time.perf_counter() - start
    R.fetch_persisting_op(f"loss_{steps - 1}")
    return seconds, summary


@contextlib.contextmanager
def running_workers(url, count, threads):
    workers = Workers(url, count, threads)
    try:
        yield
    finally:
        workers.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=66, help="hand-written steps (the folded loop: 2 fewer)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="best of this many runs per row")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    X, y = mnist_data(2 * args.steps * BATCH)
    eager_s = min(eager(X, y, args.steps) for _ in range(args.repeats))
    strategies = [("loop, no strategy", None), ("LocalSGD(2, sync_every=8)", R.parallel.LocalSGD(2, 8)),
                  ("DiLoCo(2, 8, int8)", R.parallel.DiLoCo(2, 8, compression="int8"))]
    runs = [(label, strategy, n) for n in (1, 2) for label, strategy in strategies
            if strategy is not None or n == 1]
    rows = [("eager PyTorch", "1 process", eager_s, None)]
    sizes = []
    server = LocalServer()
    try:
        R.initialize(token=f"bench-{uuid.uuid4().hex[:6]}", redis_url=server.url)
        for n_workers, group in itertools.groupby(runs, key=lambda run: run[2]):
            with running_workers(server.url, n_workers, args.threads):
                rows += [(label, n, *min((engine(X, y, args.steps, strategy) for _ in range(args.repeats)),
                                         key=lambda run: run[0])) for label, strategy, n in group]
        for label, strategy in strategies[1:]:
            for steps in (args.steps, 2 * args.steps):
                R.flush()
                hand_written(X, y, steps, strategy)
                summary = compile_planned(current_graph()).summary
                sizes.append((label, steps, summary["compiled_ops"], summary["subgraphs"]))
    finally:
        server.stop()
    samples = args.steps * BATCH
    print(f"hand-written MLP 784-256-10, batch {BATCH}, {args.steps} steps, --threads {args.threads}, "
          f"best of {args.repeats}")
    print("| run | workers | seconds | samples/s | vs eager | subgraphs | compiled ops |")
    print("|---|---|---|---|---|---|---|")
    for label, workers, seconds, summary in rows:
        plan = f"{summary['subgraphs']} | {summary['compiled_ops']}" if summary else " | "
        print(f"| {label} | {workers} | {seconds:.2f} | {samples / seconds:,.0f} | {eager_s / seconds:.2f} | "
              f"{plan} |")
    print("\nthe plan for more steps (compiled ops, subgraphs):")
    for label, steps, ops, subgraphs in sizes:
        print(f"  {label}, {steps} steps: {ops} ops, {subgraphs} subgraphs")


if __name__ == "__main__":
    main()
