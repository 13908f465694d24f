"""RavDL training end to end on the engine (embedded default, one worker) against the same training in
eager PyTorch, in one run: the iris MLP and the digits CNN of examples/.

    python benchmarks/bench_ravdl.py [--iris-epochs 100] [--digits-epochs 15] [--repeats 3] [--threads 1]

The engine's time is split into: record (building the model and recording every step), compile (R.activate:
passes, partitioning, plan upload), execute (R.execute + track_progress until every op ran) and fetch (all
batch losses). Inside execute, "kernels" is the time the same recorded ops take when run in this process by
the interpreter, and "queue" the rest (Redis hops, tensor transfer, scheduling). Target (issue 4): the
engine within 1.5x of eager.

Both sides use `--threads` torch threads per process (the worker gets it through OMP_NUM_THREADS): these
models' kernels are tiny, and on a small machine with other work running, multi-threaded tiny kernels
stall on each other (eager iris measured 10-30x slower with 2 threads than with 1 on a loaded 2-core box).
"""
import argparse
import contextlib
import io
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as TF
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import digits_cnn_sequential  # noqa: E402
import iris_sequential  # noqa: E402
import ravop as R  # noqa: E402
from ravop.graph import current_graph  # noqa: E402
from ravop.interpreter import evaluate  # noqa: E402


# ------------------------------------------------------------------------------ eager PyTorch

def eager_iris(epochs):
    X_train, _, y_train, _ = iris_sequential.iris_data()
    X, y = torch.tensor(X_train, dtype=torch.float32), torch.tensor(y_train, dtype=torch.float32)
    model = nn.Sequential(nn.Linear(4, 15), nn.BatchNorm1d(15, eps=0.01, momentum=0.99), nn.Linear(15, 30),
                          nn.Dropout(0.1), nn.Linear(30, 3), nn.Softmax(-1))
    return eager_fit(model, torch.optim.Adam(model.parameters(), lr=0.01), TF.mse_loss, X, y, epochs, 25)


def eager_digits(epochs):
    X_train, _, y_train, _ = digits_cnn_sequential.digits_data()
    X, y = torch.from_numpy(X_train), torch.from_numpy(y_train)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding="same"), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.1),
                          nn.BatchNorm2d(16, eps=0.01, momentum=0.99), nn.Conv2d(16, 32, 3, padding="same"),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.1), nn.BatchNorm2d(32, eps=0.01, momentum=0.99),
                          nn.Flatten(), nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10), nn.Softmax(-1))
    return eager_fit(model, torch.optim.Adam(model.parameters(), lr=0.001), TF.cross_entropy, X, y, epochs,
                     digits_cnn_sequential.BATCH_SIZE)


def eager_fit(model, optimizer, loss_function, X, y, epochs, batch_size):
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(X), generator=generator)
        for i in range(0, len(X), batch_size):
            rows = order[i:i + batch_size]
            loss = loss_function(model(X[rows]), y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
    torch.stack(losses)
    return {"total": time.perf_counter() - start}


# ------------------------------------------------------------------------------ the engine

def engine(example, data, epochs):
    X_train, X_test, y_train, _ = data()
    times = {}
    start = time.perf_counter()
    R.flush()
    R.Graph(name=f"bench_{example.__name__}")
    with contextlib.redirect_stdout(io.StringIO()):   # the model summary
        example.record(epochs, X_train, X_test, y_train)
    names = sorted(name for name in current_graph().persisted if name.startswith("training_loss_"))
    times["record"] = time.perf_counter() - start
    mark = time.perf_counter()
    summary = R.activate()
    times["compile"] = time.perf_counter() - mark
    mark = time.perf_counter()
    R.execute()
    R.track_progress(progress_bar=False)
    times["execute"] = time.perf_counter() - mark
    mark = time.perf_counter()
    for name in names:
        R.fetch_persisting_op(name)
    times["fetch"] = time.perf_counter() - mark
    times["total"] = time.perf_counter() - start
    return times, summary, current_graph()


def kernel_seconds(graph, repeats):
    """Time of the graph's persisted ops run by the interpreter in this process: the kernels alone."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        evaluate(list(graph.persisted.values()))
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iris-epochs", type=int, default=100)
    parser.add_argument("--digits-epochs", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each process, eager and worker")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)   # read by the worker process at its start
    R.initialize(workers=1)
    cases = [("iris MLP", iris_sequential, iris_sequential.iris_data, eager_iris, args.iris_epochs),
             ("digits CNN", digits_cnn_sequential, digits_cnn_sequential.digits_data, eager_digits,
              args.digits_epochs)]
    header = f"{'case':<12}{'epochs':>7}{'eager s':>9}{'engine s':>10}{'ratio':>7}  " \
             f"{'record':>7}{'compile':>8}{'execute':>8}{'kernels':>8}{'queue':>7}{'fetch':>7}  ops / subgraphs"
    rows = []
    for label, example, data, eager, epochs in cases:
        eager_runs = [eager(epochs)["total"] for _ in range(args.repeats)]
        runs = [engine(example, data, epochs) for _ in range(args.repeats)]
        times, summary, graph = min(runs, key=lambda run: run[0]["total"])
        kernels = kernel_seconds(graph, args.repeats)
        eager_s = min(eager_runs)
        rows.append(f"{label:<12}{epochs:>7}{eager_s:>9.2f}{times['total']:>10.2f}{times['total'] / eager_s:>7.2f}  "
                    f"{times['record']:>7.2f}{times['compile']:>8.2f}{times['execute']:>8.2f}{kernels:>8.2f}"
                    f"{max(times['execute'] - kernels, 0):>7.2f}{times['fetch']:>7.2f}  "
                    f"{summary['recorded_ops']} / {summary['subgraphs']}")
    print(header)
    print("\n".join(rows))
    print(f"best of {args.repeats} runs each (the least disturbed by other load). kernels = the same ops run "
          "in-process by the interpreter; queue = execute - kernels.")


if __name__ == "__main__":
    main()
