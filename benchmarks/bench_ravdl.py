"""RavDL `fit` end to end on the engine against the same training in eager PyTorch, in one run: the iris MLP
and the digits CNN of examples/, and an MNIST-sized MLP (synthetic 60,000 x 784 data, Dense 256 - relu -
Dense 10, cross entropy, Adam, batch 128, shuffled).

    python benchmarks/bench_ravdl.py [--iris-epochs 100] [--digits-epochs 15] [--mnist-epochs 2] [--repeats 3]
                                     [--threads 1] [--workers 1,2,4] [--sweep 1,2,4,8]

The engine's time is everything a user waits for: record (building the model and recording the fit),
compile (R.activate: passes, partitioning, plan and data upload), execute (R.execute + track_progress until
the graph is done) and fetch (every batch loss, one R.fetch_persisting_op each). Eager is the same model,
data, batch order and loss in plain PyTorch; for the MNIST MLP both sides also start from the same weights,
so their losses are compared too. Each is also run as `torch.compile(model)` (inductor) eager training; the
engine's time is printed against eager's (ratio) and against the compiled eager's best run (vs comp.). Targets
(issue 29): the digits models <= 0.8x eager on a quiet machine, MNIST <= 1.0x eager and never slower than
torch.compile'd eager.

Then: the MNIST fit on 1, 2 and 4 workers (never slower with more), and the fit recorded for 1, 2, 4 and 8
epochs, each in a fresh process (record + activate time and the process's peak memory: flat if the plan
does not grow with epochs).

Both sides use `--threads` torch threads per process: these models' kernels are small, and on a small machine
with other work running, multi-threaded small kernels stall on each other.
"""
import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as TF
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import digits_cnn_sequential  # noqa: E402
import iris_sequential  # noqa: E402
from ravdl.v2 import NeuralNetwork  # noqa: E402
from ravdl.v2.layers import Activation, Dense  # noqa: E402
from ravdl.v2.optimizers import Adam  # noqa: E402
import ravop as R  # noqa: E402
from ravop.local.embedded import LocalServer, start_worker  # noqa: E402
from ravop.record.graph import current_graph  # noqa: E402
from ravop.store import connect  # noqa: E402
from ravop.store.keys import worker_key  # noqa: E402

GRAPH_SEED = 0   # the graph seed, hence fit's shuffle seed


# ------------------------------------------------------------------------------ the MNIST-sized MLP

def mnist_data(rows=60_000):
    """Synthetic MNIST-shaped data: pixel-like features in [0, 1] and labels a linear rule can learn."""
    rng = np.random.default_rng(1)
    X = rng.random((rows, 784), dtype=np.float32)
    y = (X[:, :10] * np.arange(1, 11, dtype=np.float32)).argmax(1).astype(np.int64)
    return X, y


def mnist_weights():
    torch.manual_seed(0)
    first, second = nn.Linear(784, 256), nn.Linear(256, 10)
    return [t.detach().clone() for t in (first.weight, first.bias, second.weight, second.bias)]


def record_mnist(epochs, X, y, weights, fused=False, strategy=None):
    model = NeuralNetwork(optimizer=Adam(lr=0.001, fused=fused), loss="CrossEntropy")
    model.add(Dense(256, input_shape=(784,), initial_W=weights[0].numpy(), initial_w0=weights[1].numpy()))
    model.add(Activation("relu"))
    model.add(Dense(10, initial_W=weights[2].numpy(), initial_w0=weights[3].numpy()))
    model.fit(X, y, n_epochs=epochs, batch_size=128, shuffle=True, strategy=strategy)
    return model


# ------------------------------------------------------------------------------ eager PyTorch

def shuffled(n, epochs):
    """fit's batch order: one numpy permutation per epoch from the graph seed."""
    rng = np.random.default_rng(GRAPH_SEED)
    return [torch.from_numpy(rng.permutation(n)) for _ in range(epochs)]


def eager_iris(epochs, compiled=False):
    X_train, _, y_train, _ = iris_sequential.iris_data()
    X, y = torch.tensor(X_train, dtype=torch.float32), torch.tensor(y_train, dtype=torch.float32)
    model = nn.Sequential(nn.Linear(4, 15), nn.BatchNorm1d(15, eps=0.01, momentum=0.99), nn.Linear(15, 30),
                          nn.Dropout(0.1), nn.Linear(30, 3), nn.Softmax(-1))
    orders = [torch.arange(len(X))] * epochs   # the iris example does not shuffle
    return eager_fit(model, torch.optim.Adam(model.parameters(), lr=0.01), TF.mse_loss, X, y, orders, 25, compiled)


def eager_digits(epochs, compiled=False):
    X_train, _, y_train, _ = digits_cnn_sequential.digits_data()
    X, y = torch.from_numpy(X_train), torch.from_numpy(y_train)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding="same"), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.1),
                          nn.BatchNorm2d(16, eps=0.01, momentum=0.99), nn.Conv2d(16, 32, 3, padding="same"),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.1), nn.BatchNorm2d(32, eps=0.01, momentum=0.99),
                          nn.Flatten(), nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10), nn.Softmax(-1))
    return eager_fit(model, torch.optim.Adam(model.parameters(), lr=0.001), TF.cross_entropy, X, y,
                     shuffled(len(X), epochs), digits_cnn_sequential.BATCH_SIZE, compiled)


def eager_mnist(epochs, X, y, weights, compiled=False, fused=False):
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(w)
    X, y = torch.from_numpy(X), torch.from_numpy(y)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001, fused=fused or None)
    return eager_fit(model, optimizer, TF.cross_entropy, X, y, shuffled(len(X), epochs), 128, compiled)


def eager_fit(model, optimizer, loss_function, X, y, orders, batch_size, compiled=False):
    """(seconds, losses) of a plain PyTorch training loop over `orders` (one row order per epoch); with
    `compiled`, the model is `torch.compile(model)` (inductor), its compilation counted in the time."""
    start = time.perf_counter()
    if compiled:
        model = torch.compile(model)
    losses = []
    for order in orders:
        for i in range(0, len(X), batch_size):
            rows = order[i:i + batch_size]
            loss = loss_function(model(X[rows]), y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
    losses = torch.stack(losses)
    return time.perf_counter() - start, losses


def eager_compiled(eager, epochs, repeats, errors):
    """(seconds of the first run, best seconds of the later runs) of `eager(epochs, compiled=True)`: the first
    run compiles, later ones reuse inductor's cache; None if torch.compile failed (the error kept)."""
    try:
        runs = [eager(epochs, compiled=True)[0] for _ in range(max(repeats, 2))]
        return runs[0], min(runs[1:])
    except Exception as exc:   # torch.compile needs a C compiler and a supported Python: report, go on
        errors.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")
        return None


# ------------------------------------------------------------------------------ the engine

def loss_names(graph):
    names = list(graph.persisted) + list(getattr(graph, "step_outputs", {}))
    return sorted((n for n in names if n.startswith("training_loss_")),
                  key=lambda n: tuple(int(p) for p in n.split("_")[3::2]))


def engine(name, record):
    """(times, summary, losses) of one fit on the engine."""
    times = {}
    start = time.perf_counter()
    R.flush()
    R.Graph(name=name, seed=GRAPH_SEED)
    with contextlib.redirect_stdout(io.StringIO()):   # the model summary
        record()
    names = loss_names(current_graph())
    times["record"] = time.perf_counter() - start
    mark = time.perf_counter()
    summary = R.activate()
    times["compile"] = time.perf_counter() - mark
    mark = time.perf_counter()
    R.execute()
    R.track_progress(progress_bar=False)
    times["execute"] = time.perf_counter() - mark
    mark = time.perf_counter()
    losses = torch.stack([R.fetch_persisting_op(n) for n in names])
    times["fetch"] = time.perf_counter() - mark
    times["total"] = time.perf_counter() - start
    return times, summary, losses


class Workers:
    """`count` worker processes on the benchmark's server."""

    def __init__(self, url, count, threads):
        self.procs = [start_worker(url, f"bench-{uuid.uuid4().hex[:6]}", "cpu", threads=threads)
                      for _ in range(count)]
        client = connect(url)
        for proc in self.procs:
            name = proc.args[proc.args.index("--name") + 1]
            while not client.exists(worker_key(name)):
                if proc.poll() is not None:
                    raise RuntimeError(f"worker {name} exited at start")
                time.sleep(0.05)
        client.close()

    def stop(self):
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=60)


def probe(url, epochs, threads):
    """In a fresh process: record and activate the MNIST fit for `epochs`; print times and peak memory."""
    torch.set_num_threads(threads)
    R.initialize(token=f"probe-{uuid.uuid4().hex[:6]}", redis_url=url)
    X, y = mnist_data()
    weights = mnist_weights()
    R.flush()
    R.Graph(name="probe", seed=GRAPH_SEED)
    start = time.perf_counter()
    record_mnist(epochs, X, y, weights)
    record_s = time.perf_counter() - start
    start = time.perf_counter()
    summary = R.activate()
    activate_s = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    R.flush()
    print(json.dumps({"record": record_s, "activate": activate_s, "peak_mib": peak_mib,
                      "recorded_ops": summary["recorded_ops"], "subgraphs": summary["subgraphs"]}))


# ------------------------------------------------------------------------------ main

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iris-epochs", type=int, default=100)
    parser.add_argument("--digits-epochs", type=int, default=15)
    parser.add_argument("--mnist-epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each process, eager and worker")
    parser.add_argument("--workers", default="1,2,4", help="worker counts for the MNIST fit")
    parser.add_argument("--sweep", default="1,2,4,8", help="epoch counts for the record/activate sweep")
    parser.add_argument("--probe", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe is not None:
        return probe(args.url, args.probe, args.threads)
    torch.set_num_threads(args.threads)
    server = LocalServer()
    try:
        run(args, server.url)
    finally:
        server.stop()


def run(args, url):
    R.initialize(token="bench", redis_url=url)
    X_mnist, y_mnist = mnist_data()
    weights = mnist_weights()
    iris = iris_sequential.iris_data()
    digits = digits_cnn_sequential.digits_data()
    cases = [("iris MLP", args.iris_epochs, eager_iris,
              lambda e: iris_sequential.record(e, iris[0], iris[1], iris[2])),
             ("digits CNN", args.digits_epochs, eager_digits,
              lambda e: digits_cnn_sequential.record(e, digits[0], digits[1], digits[2])),
             ("MNIST MLP", args.mnist_epochs, lambda e, compiled=False: eager_mnist(e, X_mnist, y_mnist, weights,
                                                                                    compiled),
              lambda e: record_mnist(e, X_mnist, y_mnist, weights))]
    print(f"{'case':<12}{'epochs':>7}{'eager s':>9}{'compiled':>12}{'engine s':>10}{'ratio':>7}{'vs comp.':>9}  "
          f"{'record':>7}{'compile':>8}{'execute':>8}{'fetch':>7}  {'ops / subgraphs':<17}max |loss - eager|")
    compile_errors = []
    pool = Workers(url, 1, args.threads)
    try:
        for label, epochs, eager, record in cases:
            eager_runs = [eager(epochs) for _ in range(args.repeats)]
            compiled = eager_compiled(eager, epochs, args.repeats, compile_errors)
            runs = [engine(label.split()[0], lambda: record(epochs)) for _ in range(args.repeats)]
            times, summary, losses = min(runs, key=lambda run: run[0]["total"])
            eager_s, eager_losses = min(eager_runs, key=lambda run: run[0])
            agree = f"{(losses - eager_losses).abs().max():.1e}" if label.startswith("MNIST") else \
                "- (own initial weights, dropout)"
            compiled_s = "error" if compiled is None else f"{compiled[0]:.1f}/{compiled[1]:.2f}"
            versus = "-" if compiled is None else f"{times['total'] / compiled[1]:.2f}"
            print(f"{label:<12}{epochs:>7}{eager_s:>9.2f}{compiled_s:>12}{times['total']:>10.2f}"
                  f"{times['total'] / eager_s:>7.2f}{versus:>9}  "
                  f"{times['record']:>7.2f}{times['compile']:>8.2f}{times['execute']:>8.2f}{times['fetch']:>7.2f}  "
                  f"{summary['recorded_ops']} / {summary['subgraphs']:<8}{agree}", flush=True)
    finally:
        pool.stop()
    print("compiled: the same eager training with torch.compile(model) (inductor): the first run's seconds, "
          "which compile, / the best later one; ratio = engine / eager, vs comp. = engine / that best later run")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for error in compile_errors[:1]:
        print(f"torch.compile failed here: {error}")

    print(f"\nMNIST MLP, {args.mnist_epochs} epochs, on more workers (best of {args.repeats}):")
    for count in [int(c) for c in args.workers.split(",")]:
        pool = Workers(url, count, args.threads)
        try:
            best = min(engine("mnist", lambda: record_mnist(args.mnist_epochs, X_mnist, y_mnist, weights))[0]["total"]
                       for _ in range(args.repeats))
        finally:
            pool.stop()
        print(f"  {count} worker{'s' if count > 1 else ' '}: {best:.2f} s", flush=True)

    print("\nMNIST MLP fit recorded for more epochs, each in a fresh process (record + activate, peak RSS):")
    for epochs in [int(e) for e in args.sweep.split(",")]:
        out = subprocess.run([sys.executable, __file__, "--probe", str(epochs), "--url", url, "--threads",
                              str(args.threads)], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {epochs} epochs: record {result['record']:.2f} s, activate {result['activate']:.2f} s, peak "
              f"{result['peak_mib']:,.0f} MiB, {result['recorded_ops']} ops recorded, {result['subgraphs']} "
              "subgraphs", flush=True)
    print(f"\nbest of {args.repeats} runs each (the least disturbed by other load).")


if __name__ == "__main__":
    main()
