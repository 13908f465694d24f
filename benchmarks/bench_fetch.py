"""Per-loss fetches of a finished fit, as the RavDL guide writes them: microseconds per
`R.fetch_persisting_op('training_loss_epoch_1_batch_1')` in a loop over every loss (goal: <= 100 us, issue 29).

The fit is the digits MLP (Dense 64-relu-Dense 10, Adam, batch 32; 8 epochs = 272 steps by default) on the
README's embedded default (`R.initialize()`). Once it is done, each loss is fetched by name; the first fetch
reads every small value of the graph in one round trip and the rest answer from that copy. Printed per fit:
the first fetch, the others' mean and slowest, and a second loop over the same names; beside them one
`R.fetch_losses()` (every loss as arrays, one call) and one PING of the same server (one round trip, the anchor).

    python benchmarks/bench_fetch.py [--epochs 8] [--batch 32] [--repeats 3]
"""
import argparse
import contextlib
import io
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import ravop as R  # noqa: E402
from example_data import digits_data  # noqa: E402
from ravdl.v2 import NeuralNetwork  # noqa: E402
from ravdl.v2.layers import Activation, Dense  # noqa: E402
from ravdl.v2.optimizers import Adam  # noqa: E402
from ravop.core.loss_names import training_loss_name  # noqa: E402

GOAL_US = 100.0


def finished_fit(epochs, batch, X, y):
    """Record, run and wait for a digits MLP fit; the names of its batch losses in the guide's order."""
    R.flush()
    R.Graph(name="bench_fetch", seed=0)
    model = NeuralNetwork(optimizer=Adam(lr=0.001), loss="CrossEntropy")
    model.add(Dense(64, input_shape=(64,)))
    model.add(Activation("relu"))
    model.add(Dense(10))
    model.add(Activation("softmax"))
    with contextlib.redirect_stdout(io.StringIO()):
        model.fit(X.reshape(len(X), -1), y, n_epochs=epochs, batch_size=batch, shuffle=True)
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    steps = -(-len(X) // batch)
    return [training_loss_name(epoch, step) for epoch in range(1, epochs + 1) for step in range(1, steps + 1)]


def timed_fetches(names):
    """Seconds of each `R.fetch_persisting_op(name)`, in order."""
    seconds = []
    for name in names:
        start = time.perf_counter()
        R.fetch_persisting_op(name)
        seconds.append(time.perf_counter() - start)
    return seconds


def one_fit(epochs, batch, X, y, client):
    names = finished_fit(epochs, batch, X, y)
    first_loop = timed_fetches(names)
    second_loop = timed_fetches(names)
    start = time.perf_counter()
    losses = R.fetch_losses()
    fetch_losses_s = time.perf_counter() - start
    assert len(losses.batch) == len(names), (len(losses.batch), len(names))
    pings = []
    for _ in range(20):
        start = time.perf_counter()
        client.ping()
        pings.append(time.perf_counter() - start)
    return {"names": len(names), "first": first_loop[0], "rest_mean": statistics.fmean(first_loop[1:]),
            "rest_max": max(first_loop[1:]), "loop_mean": statistics.fmean(first_loop),
            "second_mean": statistics.fmean(second_loop), "fetch_losses": fetch_losses_s,
            "ping": statistics.median(pings)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    X, _, y, _ = digits_data()
    session = R.initialize(token="bench-fetch")
    session.embedded.wait_ready(session.client)
    print(f"load average {os.getloadavg()[0]:.2f}; digits MLP fit, {args.epochs} epochs, batch {args.batch}")
    print(f"{'fit':>3} {'losses':>7} {'first us':>9} {'rest us':>8} {'rest max':>9} {'loop us':>8} "
          f"{'again us':>9} {'fetch_losses us':>16} {'PING us':>8}")
    runs = []
    for i in range(args.repeats):
        run = one_fit(args.epochs, args.batch, X, y, session.client)
        runs.append(run)
        print(f"{i + 1:>3} {run['names']:>7} {run['first'] * 1e6:>9.0f} {run['rest_mean'] * 1e6:>8.1f} "
              f"{run['rest_max'] * 1e6:>9.0f} {run['loop_mean'] * 1e6:>8.1f} {run['second_mean'] * 1e6:>9.1f} "
              f"{run['fetch_losses'] * 1e6:>16.0f} {run['ping'] * 1e6:>8.0f}", flush=True)
    best = min(run["loop_mean"] for run in runs)
    print(f"\nper-loss fetch over a whole loop (the first's round trip included), best fit: {best * 1e6:.1f} us; "
          f"goal <= {GOAL_US:.0f} us: {'met' if best <= GOAL_US * 1e-6 else 'missed'}")
    session.close()


if __name__ == "__main__":
    main()
