"""The digits MLP and CNN `fit` on the README's embedded default (`R.initialize()`: a private server and 2 local
workers) against the same training in eager PyTorch, in one run: first on the machine as it is, then with two
busy processes sharing its cores (a pure-Python loop and a PyTorch matmul loop on torch's default threads), as
on a user's laptop or a provider's shared machine.

    python benchmarks/bench_contention.py [--epochs 5] [--batch 32] [--repeats 3] [--workers 2] [--fused]

Each fit is what a user waits for: record, R.activate, R.execute + track_progress, and every batch loss
fetched by name (`R.fetch_persisting_op('training_loss_epoch_1_batch_1')`, ...) as the RavDL guide writes it.
Eager runs in this process on one torch thread. Also printed: the time from R.initialize() to the first result
of a trivial graph that a worker computes (workers starting), and the machine's load average before each part
(other jobs count).
Targets (issue 29): <= 0.8x eager quiet, <= 1.5x with the busy processes. Adam is torch's default update on both
sides (`--fused`: its fused kernel on both, `Adam(fused=True)`).
"""
import argparse
import contextlib
import functools
import io
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as TF
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ravop as R  # noqa: E402
from ravop.client import session as sessions  # noqa: E402
import digits_cnn_sequential  # noqa: E402
from example_data import digits_data  # noqa: E402
from ravdl.v2 import NeuralNetwork  # noqa: E402
from ravdl.v2.layers import Activation, Dense  # noqa: E402
from ravdl.v2.optimizers import Adam  # noqa: E402
from ravop.core.loss_names import training_loss_name  # noqa: E402
from bench_startup import first_result  # noqa: E402
from busy import busy_processes, load  # noqa: E402

SEED = 0


# ------------------------------------------------------------------------------ the models, both sides

def record_mlp(epochs, batch, X, y, fused=False):
    model = NeuralNetwork(optimizer=Adam(lr=0.001, fused=fused), loss="CrossEntropy")
    model.add(Dense(64, input_shape=(64,)))
    model.add(Activation("relu"))
    model.add(Dense(10))
    model.add(Activation("softmax"))
    model.fit(X.reshape(len(X), -1), y, n_epochs=epochs, batch_size=batch, shuffle=True)
    return model


def record_cnn(epochs, batch, X, y, fused=False):
    model = digits_cnn_sequential.untrained_model()
    model.optimizer = Adam(lr=model.optimizer.hyper["lr"], fused=fused)
    model.fit(X, y, n_epochs=epochs, batch_size=batch, shuffle=True)
    return model


def eager_mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10), nn.Softmax(-1))


def eager_cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding="same"), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.1),
                         nn.BatchNorm2d(16, eps=0.01, momentum=0.99), nn.Conv2d(16, 32, 3, padding="same"),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.1), nn.BatchNorm2d(32, eps=0.01, momentum=0.99),
                         nn.Flatten(), nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10), nn.Softmax(-1))


def eager_fit(make_model, epochs, batch, X, y, fused=False):
    """Seconds of the same training in plain PyTorch: fit's batch order, Adam (torch's default on a CPU, the
    per-parameter loop; `fused`: its fused kernel, as the engine's), cross entropy."""
    start = time.perf_counter()
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001, fused=fused or None)
    X, y = torch.from_numpy(X), torch.from_numpy(y)
    rng = np.random.default_rng(SEED)
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(len(X)))
        for i in range(0, len(X), batch):
            rows = order[i:i + batch]
            loss = TF.cross_entropy(model(X[rows]), y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss.item()
    return time.perf_counter() - start


def engine_fit(record, epochs, batch, X, y):
    """(seconds, seconds fetching) of one fit on the engine, every loss fetched by name."""
    start = time.perf_counter()
    R.flush()
    R.Graph(name="contention", seed=SEED)
    with contextlib.redirect_stdout(io.StringIO()):
        record(epochs, batch, X, y)
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    mark = time.perf_counter()
    steps = -(-len(X) // batch)
    for epoch in range(1, epochs + 1):
        for step in range(1, steps + 1):
            R.fetch_persisting_op(training_loss_name(epoch, step))
    end = time.perf_counter()
    return end - start, end - mark


def compare(args, X, y):
    cases = [("digits MLP", eager_mlp, record_mlp), ("digits CNN", eager_cnn, record_cnn)]
    for label, eager_model, record in cases:
        eager_s = min(eager_fit(eager_model, args.epochs, args.batch, X, y, args.fused) for _ in range(args.repeats))
        runs = [engine_fit(functools.partial(record, fused=args.fused), args.epochs, args.batch, X, y)
                for _ in range(args.repeats)]
        engine_s, fetch_s = min(runs)
        fetches = args.epochs * -(-len(X) // args.batch)
        print(f"  {label:<11} eager {eager_s:6.2f} s   engine {engine_s:6.2f} s   ratio {engine_s / eager_s:5.2f}x"
              f"   ({fetches} losses fetched in {fetch_s * 1e3:.0f} ms, {fetch_s / fetches * 1e6:.0f} us each)",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None, help="embedded workers (default: R.initialize's)")
    parser.add_argument("--fused", action="store_true", help="Adam(fused=True) on both sides")
    args = parser.parse_args()
    torch.set_num_threads(1)
    X, _, y, _ = digits_data()
    print(f"{os.cpu_count()} cores, torch {torch.__version__}; {load()}", flush=True)
    seconds = first_result("bench-contention", args.workers)["first"]
    print(f"R.initialize() to the first result of a trivial graph: {seconds:.2f} s")
    session = sessions.require()
    session.embedded.wait_ready(session.client)   # the later embedded workers start once the first is up
    threads = sorted(w["threads"] for w in sessions.live_workers())
    print(f"embedded workers' torch threads: {threads}; this process: {torch.get_num_threads()}")
    print(f"\nas the machine is ({load()}), best of {args.repeats}:", flush=True)
    compare(args, X, y)
    with busy_processes():
        print(f"\nwith two busy processes ({load()}), best of {args.repeats}:", flush=True)
        compare(args, X, y)


if __name__ == "__main__":
    main()
