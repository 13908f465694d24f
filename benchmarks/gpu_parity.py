"""GPU acceptance check (issue 10): training graphs run by a worker on `--device` give the CPU worker's results.

    python benchmarks/gpu_parity.py [--device cuda] [--epochs 2]

The same recordings run twice: as a CPU graph on a CPU worker, and with gpu_required='yes' on a worker on
`--device`. They are, on sklearn's 8x8 digits:
- RavDL, once per optimizer (Adam, RMSprop, AdamW): a CNN (Conv2D, BatchNormalization2D, MaxPooling2D,
  Dropout, Flatten, Dense, LayerNormalization) on the images, and a token model (Embedding,
  LayerNormalization, Dropout, Dense) reading each image's 64 pixel intensities (0..16) as tokens;
- Pytorch_Model: a TorchScript CNN (Conv2d, BatchNorm2d, Linear) with Adam. It has no Dropout: TorchScript
  code draws from the device's own generator (Philox on CUDA), so a GPU and a CPU worker would drop different
  units; RavDL's Dropout draws on the host and gives both the same mask.
Checked: every batch loss agrees to 1e-4 relative, every test prediction to 1e-4 with the same predicted
classes, and each fetched trained model loads and runs on the CPU, reproducing its own graph's prediction.
Without a GPU, `--device cpu` runs both graphs on CPU workers: a check of this script, not of the GPU path.
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import ravop as R  # noqa: E402
from example_data import accuracy, digits_data  # noqa: E402
from ravdl.v2 import NeuralNetwork, Pytorch_Model  # noqa: E402
from ravdl.v2.layers import (Activation, BatchNormalization2D, Conv2D, Dense, Dropout, Embedding,  # noqa: E402
                             Flatten, LayerNormalization, MaxPooling2D)
from ravdl.v2.optimizers import Adam, AdamW, RMSprop  # noqa: E402
from ravdl.v2.utils import batch_iterator  # noqa: E402
from ravop.local.embedded import start_worker  # noqa: E402

BATCH_SIZE = 64
OPTIMIZERS = {"adam": lambda: Adam(lr=0.003), "rmsprop": lambda: RMSprop(lr=0.001),
              "adamw": lambda: AdamW(lr=0.003, weight_decay=0.05)}


def ravdl_cnn(optimizer):
    model = NeuralNetwork(optimizer=optimizer, loss="CrossEntropy")
    for layer in (Conv2D(1, 8, 3, padding="same", input_shape=(1, 8, 8)), BatchNormalization2D(8),
                  Activation("relu"), MaxPooling2D(2), Dropout(0.1), Flatten(), Dense(64), LayerNormalization(),
                  Activation("relu"), Dense(10), Activation("softmax")):
        model.add(layer)
    return model


def ravdl_tokens(optimizer):
    model = NeuralNetwork(optimizer=optimizer, loss="CrossEntropy")
    for layer in (Embedding(17, 8), LayerNormalization(), Flatten(), Dropout(0.1), Dense(64), Activation("relu"),
                  Dense(10), Activation("softmax")):
        model.add(layer)
    return model


class TorchCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def cases(model_path):
    """{case: (a function making the untrained model, the inputs it reads: "images" or "tokens")}"""
    found = {}
    for name, optimizer in OPTIMIZERS.items():
        found[f"ravdl_cnn_{name}"] = (lambda o=optimizer: ravdl_cnn(o()), "images")
        found[f"ravdl_tokens_{name}"] = (lambda o=optimizer: ravdl_tokens(o()), "tokens")
    found["pytorch_model_adam"] = (lambda: _pytorch_model(model_path), "images")
    return found


def _pytorch_model(model_path):
    model = Pytorch_Model(model_op=R.model(model_path))
    model.initialize(Adam(lr=0.003))
    return model


def _train_step(model, X, y):
    if isinstance(model, Pytorch_Model):
        loss = R.cross_entropy_loss(R.t(y), model._forward_pass(R.t(X)))
        model._backward_pass(loss)
        return loss
    return model.train_on_batch(X, y)


def _predict(model, X):
    if isinstance(model, Pytorch_Model):
        return model._forward_pass(R.t(X), training=False)
    return model.predict(X)


def record(model_path, epochs, inputs):
    """Record every case's training and test prediction; returns {case: [persisted loss names]}."""
    losses = {}
    for case, (make, kind) in cases(model_path).items():
        X_train, X_test, y_train = inputs[kind]
        model = make()
        rng = np.random.default_rng(0)
        names = losses[case] = []
        for epoch in range(epochs):
            for X, y in batch_iterator(X_train, y_train, BATCH_SIZE, shuffle=True, seed=rng):
                names.append(f"{case}_loss_{len(names)}")
                _train_step(model, X, y).persist_op(names[-1])
        _predict(model, X_test).persist_op(f"{case}_prediction")
        model.save_model(f"{case}_model")
    return losses


def run(model_path, epochs, inputs, gpu):
    R.Graph(name=f"gpu_parity_{'gpu' if gpu else 'cpu'}", gpu_required="yes" if gpu else "no", seed=0)
    names = record(model_path, epochs, inputs)
    start = time.perf_counter()
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    seconds = time.perf_counter() - start
    results = {}
    for case, (_, kind) in cases(model_path).items():
        module = R.fetch_persisting_op(f"{case}_model").eval()
        with torch.no_grad():
            module_prediction = module(torch.from_numpy(inputs[kind][1]))
        results[case] = (torch.stack([R.fetch_persisting_op(n) for n in names[case]]),
                         R.fetch_persisting_op(f"{case}_prediction"), module_prediction)
    return results, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device is visible here; run with --device cpu to check the script itself")
    session = R.initialize(workers=1)   # the CPU worker
    log = os.path.join(tempfile.gettempdir(), f"gpu-parity-worker-{os.getpid()}.log")
    worker = start_worker(session.url, f"parity-{args.device.replace(':', '-')}", args.device, log_path=log,
                          parent_pid=os.getpid())
    X_train, X_test, y_train, y_test = digits_data()
    tokens = lambda X: np.rint(X * 16).astype(np.int64).reshape(len(X), 64)  # noqa: E731
    inputs = {"images": (X_train, X_test, y_train), "tokens": (tokens(X_train), tokens(X_test), y_train)}
    try:
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "torch_cnn.pt")
            torch.jit.save(torch.jit.script(TorchCNN()), path)
            cpu, cpu_s = run(path, args.epochs, inputs, gpu=False)
            other, other_s = run(path, args.epochs, inputs, gpu=args.device.startswith("cuda"))
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    print(f"whole graph: cpu {cpu_s:.2f} s, {args.device} {other_s:.2f} s")
    print(f"{'case':<22}{'steps':>6}{'last loss':>11}{'max rel loss gap':>18}{'max pred gap':>14}"
          f"{'accuracy cpu/' + args.device:>22}{'module vs graph':>17}")
    failures = []
    for case in cpu:
        (cpu_losses, cpu_pred, cpu_module), (losses, pred, module) = cpu[case], other[case]
        rel = float(((losses - cpu_losses).abs() / cpu_losses.abs()).max())
        pred_gap = float((pred - cpu_pred).abs().max())
        module_gap = max(float((module - pred).abs().max()), float((cpu_module - cpu_pred).abs().max()))
        print(f"{case:<22}{len(losses):>6}{float(losses[-1]):>11.4f}{rel:>18.1e}{pred_gap:>14.1e}"
              f"{accuracy(cpu_pred, y_test):>11.3f}/{accuracy(pred, y_test):.3f}{module_gap:>17.1e}")
        if rel > 1e-4:
            failures.append(f"{case}: losses differ by {rel:.1e} relative")
        if pred_gap > 1e-4 or not torch.equal(pred.argmax(1), cpu_pred.argmax(1)):
            failures.append(f"{case}: predictions differ by {pred_gap:.1e} or in their classes")
        if module_gap > 1e-5:
            failures.append(f"{case}: the fetched module differs from its graph's prediction by {module_gap:.1e}")
    if failures:
        raise SystemExit(f"{args.device} vs cpu: " + "; ".join(failures))
    print(f"{args.device} matches cpu: losses to 1e-4 relative, predictions to 1e-4 (same classes); every "
          "fetched model runs on the CPU and reproduces its graph")


if __name__ == "__main__":
    main()
