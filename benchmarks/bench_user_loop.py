"""A hand-written training loop (examples/original_ann_functional.py's model and loop, `R.t` of each batch,
`_forward_pass`, `_backward_pass`) recorded for 1 and 10 epochs, each in a fresh process, compiled with and
without folding the repeated steps into a loop (compiler/passes/loops.py): compile time, plan size, ops
shipped and the process's peak memory; then the longest loop run on one worker, both ways.

    python benchmarks/bench_user_loop.py [--epochs 1,10,30] [--repeats 3]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import ravop as R  # noqa: E402
from bench_ravdl import Workers  # noqa: E402
from compiler import compile_graph  # noqa: E402
from compiler.passes import loops as loops_pass  # noqa: E402
from example_data import iris_data  # noqa: E402
from ravdl.v2 import Functional  # noqa: E402
from ravdl.v2.layers import Activation, BatchNormalization1D, CustomLayer, Dense, Dropout  # noqa: E402
from ravdl.v2.optimizers import Adam  # noqa: E402
from ravdl.v2.utils.data_manipulation import batch_iterator  # noqa: E402
from ravop.local.embedded import LocalServer  # noqa: E402


class First(CustomLayer):
    def __init__(self):
        super().__init__()
        self.d1, self.bn1 = Dense(15, input_shape=(4,)), BatchNormalization1D(momentum=0.99, epsilon=0.01)

    def _forward_pass_call(self, input, training=True):
        return self.bn1._forward_pass(self.d1._forward_pass(input), training=training)


class Second(CustomLayer):
    def __init__(self):
        super().__init__()
        self.d1, self.dropout, self.d2 = Dense(30), Dropout(0.1), Dense(3)

    def _forward_pass_call(self, input, training=True):
        return self.d2._forward_pass(self.dropout._forward_pass(self.d1._forward_pass(input), training=training))


class ANNModel(Functional):
    def __init__(self):
        super().__init__()
        self.first, self.second, self.act = First(), Second(), Activation("softmax")
        self.initialize_params(Adam(lr=0.01))

    def _forward_pass_call(self, input, training=True):
        o = self.first._forward_pass(input, training=training)
        return self.act._forward_pass(self.second._forward_pass(o, training=training))


def record(epochs):
    """The user loop of examples/original_ann_functional.py, each batch's loss persisted."""
    X, X_test, y, _ = iris_data()
    model = ANNModel()
    for epoch in range(epochs):
        for b, (X_batch, y_batch) in enumerate(batch_iterator(X, y, batch_size=25)):
            loss = R.square_loss(R.t(y_batch), model._forward_pass(R.t(X_batch)))
            model._backward_pass(loss)
            loss.persist_op(f"loss_{epoch}_{b}")
    model._forward_pass(R.t(X_test), training=False).persist_op("prediction")


def no_folding():
    loops_pass._fold_once = lambda ir: (ir, 0)


def probe(epochs, fold):
    """In a fresh process: record and compile; print the figures."""
    torch.set_num_threads(1)
    if not fold:
        no_folding()
    graph = R.Graph(name="user loop", seed=0)
    start = time.perf_counter()
    record(epochs)
    record_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = compile_graph(graph)
    compile_s = time.perf_counter() - start
    print(json.dumps({"record": record_s, "compile": compile_s, "plan_kib": compiled.plan.ByteSize() / 1024,
                      "ops": compiled.summary["compiled_ops"], "recorded": compiled.summary["recorded_ops"],
                      "loop_steps": compiled.summary["loop_steps"], "subgraphs": compiled.summary["subgraphs"],
                      "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_on_engine(epochs, fold, repeats):
    """Best seconds from R.activate() to every loss fetched, on the embedded default's one worker."""
    best = None
    for _ in range(repeats):
        R.flush()
        graph = R.Graph(name="user loop", seed=0)
        record(epochs)
        names = list(graph.persisted)
        start = time.perf_counter()
        R.activate()
        R.execute()
        R.track_progress(progress_bar=False)
        values = [R.fetch_persisting_op(name) for name in names]
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    return best, values


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", default="1,10,30")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probe", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-fold", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe is not None:
        return probe(args.probe, not args.no_fold)
    print("user loop (iris, original_ann_functional.py style), record + compile in a fresh process each, "
          f"best of {args.repeats}:")
    print(f"{'epochs':>6} {'folding':>8}{'record s':>10}{'compile s':>11}{'plan KiB':>10}{'ops shipped':>13}"
          f"{'loop steps':>12}{'peak MiB':>10}")
    for epochs in [int(e) for e in args.epochs.split(",")]:
        for fold in (False, True):
            results = []
            for _ in range(args.repeats):
                out = subprocess.run([sys.executable, __file__, "--probe", str(epochs)] + ([] if fold else ["--no-fold"]),
                                     capture_output=True, text=True, check=True,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
                results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = min(results, key=lambda r: r["compile"])
            peak = min(r["peak_mib"] for r in results)
            print(f"{epochs:>6} {'on' if fold else 'off':>8}{r['record']:>10.3f}{r['compile']:>11.3f}"
                  f"{r['plan_kib']:>10.1f}{r['ops']:>13}{r['loop_steps']:>12}{peak:>10.0f}", flush=True)
    epochs = max(int(e) for e in args.epochs.split(","))
    torch.set_num_threads(1)
    server = LocalServer()
    try:
        R.initialize(token="bench-user-loop", redis_url=server.url)
        pool = Workers(server.url, 1, threads=1)   # one thread: small kernels, a shared machine
        try:
            folded_s, folded = run_on_engine(epochs, True, args.repeats)
            no_folding()
            unrolled_s, unrolled = run_on_engine(epochs, False, args.repeats)
        finally:
            pool.stop()
    finally:
        server.stop()
    same = all(torch.equal(a, b) for a, b in zip(folded, unrolled))
    print(f"\n{epochs} epochs on one worker (one thread), activate to last loss fetched (best of "
          f"{args.repeats}): folded {folded_s:.2f} s, unrolled {unrolled_s:.2f} s; same bits: {same}")


if __name__ == "__main__":
    main()
