"""EarlyStopping decided in the loop (issue 45): how many epochs after its decision a fast model's loop ends, and
what the decision costs a fit that never stops, on the README's embedded default (`R.initialize()`).

    python benchmarks/bench_loop_stopping.py [--epochs 300] [--repeats 3]

The model (a 6-32-1 MLP, 3 steps an epoch plus a validation step) runs hundreds of epochs a second on one worker.
Printed, each a fit as a user waits for it (record, R.activate, R.execute, R.track_progress), best of `repeats`:
- the fit without callbacks, and with EarlyStopping(patience > epochs), which records its rule into the loop and
  never stops: the ratio is the rule's cost;
- EarlyStopping(patience=3): the epoch whose end decided (its persisted decisions) and the epoch the loop ended at;
- the same rule as a plain Callback subclass (the requester's poll, as every callback but EarlyStopping still is, and
  EarlyStopping was before): the epoch it decided at and the epoch the loop ended at.
"""
import argparse
import math
import time

import numpy as np

import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.callbacks import Callback, EarlyStopping
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam


class PolledEarlyStopping(Callback):
    """EarlyStopping's rule on the requester, fed by its poll of the losses, asking the graph to stop."""

    def __init__(self, patience):
        self.patience, self.best, self.wait, self.decided = patience, math.inf, 0, None

    def on_epoch_end(self, epoch, logs=None):
        if self.decided is not None:
            return
        if logs["val_loss"] < self.best:
            self.best, self.wait = logs["val_loss"], 0
            return
        self.wait += 1
        if self.wait > self.patience:
            self.decided = epoch + 1
            self.stop_reason = "polled EarlyStopping"
            self.model.stop_training = True


def fit(epochs, callbacks):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(48, 6)).astype(np.float32)
    y = (X[:, :1] * 0.5 - X[:, 1:2] + 0.3 * rng.normal(size=(48, 1))).astype(np.float32)
    R.Graph(name="bench stop")
    net = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss", validation_data=(X[:16], y[:16]))
    net.add(Dense(32, input_shape=(6,)))
    net.add(Activation("tanh"))
    net.add(Dense(1))
    began = time.perf_counter()
    history = net.fit(X, y, n_epochs=epochs, batch_size=16, callbacks=callbacks)
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=600)
    return time.perf_counter() - began, history


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    R.initialize()
    R.flush()
    fit(5, [])   # workers warm
    plain = min(fit(args.epochs, [])[0] for _ in range(args.repeats))
    ruled = min(fit(args.epochs, [EarlyStopping(patience=args.epochs + 1)])[0] for _ in range(args.repeats))
    print(f"fit of {args.epochs} epochs: {plain:.3f} s plain, {ruled:.3f} s with an EarlyStopping that never stops "
          f"({ruled / plain:.2f}x), {args.epochs / plain:.0f} epochs/s")
    seconds, history = fit(args.epochs, [EarlyStopping(patience=3)])
    decided = [bool(R.fetch_persisting_op(f"early_stopping_1_epoch_{e}")) for e in range(1, history.stopped_after + 1)]
    print(f"EarlyStopping(patience=3) in the loop: decided at epoch {decided.index(True) + 1}, loop ended at epoch "
          f"{history.stopped_after} ({seconds:.3f} s)")
    polled = PolledEarlyStopping(patience=3)
    seconds, history = fit(args.epochs, [polled])
    ended = history.stopped_after if history.stopped_after is not None else args.epochs
    print(f"the same rule polled by the requester: decided at epoch {polled.decided}, loop ended at epoch {ended} "
          f"({seconds:.3f} s)")


if __name__ == "__main__":
    main()
