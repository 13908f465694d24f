"""Fit, then use (issue 45): what persisting a fit's trained values costs the fit, and what predicting in the next
graph (its values read from the store once) costs, on the README's
embedded default (`R.initialize()`).

    python benchmarks/bench_fit_then_use.py [--epochs 5] [--repeats 3]

A digits-sized MLP (1,797 x 64 -> 256 -> 10, Adam, batches of 32), each figure the best of `repeats`, in one run:
- fit as a user waits for it (record, R.activate, R.execute, R.track_progress), as shipped (the carried values
  persisted for the next graph), and with that persisting switched off in this process;
- predict of 1,797 rows in a new graph after the fit (its values read from the store), from recording to fetching
  the prediction.
"""
import argparse
import time

import numpy as np

import ravop as R
from ravdl.v2 import NeuralNetwork, trained_values
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam

rng = np.random.default_rng(0)
X = rng.normal(size=(1797, 64)).astype(np.float32)
y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 1797)]


def run():
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=600)


def fit(epochs):
    R.Graph(name="bench fit then use")
    model = NeuralNetwork(Adam(lr=0.001), loss="CrossEntropy")
    model.add(Dense(256, input_shape=(64,)))
    model.add(Activation("relu"))
    model.add(Dense(10))
    began = time.perf_counter()
    model.fit(X, y, n_epochs=epochs, batch_size=32)
    run()
    return time.perf_counter() - began, model


def predict_next(model):
    began = time.perf_counter()
    R.Graph(name="bench predict")
    model.predict(X).persist_op("prediction")
    run()
    R.fetch_persisting_op("prediction")
    return time.perf_counter() - began


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    R.initialize()
    R.flush()
    fit(1)   # workers warm
    persist = trained_values.persist
    shipped, without = [], []
    for _ in range(args.repeats):   # interleaved: the machine's load changes over a run
        shipped.append(fit(args.epochs)[0])
        trained_values.persist = lambda values: None
        try:
            without.append(fit(args.epochs)[0])
        finally:
            trained_values.persist = persist
    shipped, without = min(shipped), min(without)
    print(f"fit of {args.epochs} epochs: {shipped:.3f} s persisting its trained values, {without:.3f} s without "
          f"({shipped / without:.2f}x)")
    nexts = []
    for _ in range(args.repeats):
        _, model = fit(args.epochs)
        nexts.append(predict_next(model))
    print(f"predict of {len(X)} rows in the next graph (values read from the store once; record, run, fetch): "
          f"{min(nexts):.3f} s")


if __name__ == "__main__":
    main()
