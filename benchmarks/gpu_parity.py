"""Issue 5's GPU acceptance check, for a machine with a GPU: the digits TorchScript CNN graph run by a CUDA
worker gives the CPU worker's results (every batch loss and the test prediction) to 1e-4, and each run's
fetched module reproduces its own prediction.

    python benchmarks/gpu_parity.py [--device cuda] [--epochs 3]

One embedded server, one CPU worker and one worker on `--device`; the same recording runs twice, once as a
CPU graph and once with gpu_required='yes'. Without a GPU, `--device cpu` runs both graphs on CPU workers:
a check of this script, not of the GPU path.
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import digits_torchscript as example  # noqa: E402
import ravop as R  # noqa: E402
from ravop.embedded import start_worker  # noqa: E402


def run(model_path, epochs, data, gpu):
    X_train, X_test, y_train, _ = data
    R.Graph(name=f"gpu_parity_{'gpu' if gpu else 'cpu'}", gpu_required="yes" if gpu else "no", seed=0)
    example.record(model_path, epochs, X_train, X_test, y_train)
    names = sorted(name for name in R.current_graph().persisted if name.startswith("training_loss_"))
    start = time.perf_counter()
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    seconds = time.perf_counter() - start
    losses = torch.stack([R.fetch_persisting_op(name) for name in names])
    prediction = R.fetch_persisting_op("test_prediction")
    module = R.fetch_persisting_op("my_net").eval()
    with torch.no_grad():
        module_prediction = module(torch.from_numpy(X_test))
    return losses, prediction, module_prediction, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device is visible here; run with --device cpu to check the script itself")
    session = R.initialize(workers=1)   # the CPU worker
    log = os.path.join(tempfile.gettempdir(), f"gpu-parity-worker-{os.getpid()}.log")
    worker = start_worker(session.url, f"parity-{args.device.replace(':', '-')}", args.device, log_path=log,
                          parent_pid=os.getpid())
    try:
        data = example.digits_data()
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "digits_cnn.pt")
            torch.jit.save(torch.jit.script(example.DigitsCNN()), path)
            cpu = run(path, args.epochs, data, gpu=False)
            other = run(path, args.epochs, data, gpu=args.device.startswith("cuda"))
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    labels = data[3]
    print(f"{'run':<8}{'seconds':>9}{'last loss':>11}{'test accuracy':>15}{'module accuracy':>17}")
    for label, (losses, prediction, module_prediction, seconds) in (("cpu", cpu), (args.device, other)):
        print(f"{label:<8}{seconds:>9.2f}{float(losses[-1]):>11.4f}{example.accuracy(prediction, labels):>15.3f}"
              f"{example.accuracy(module_prediction, labels):>17.3f}")
    gaps = {"losses": (cpu[0] - other[0]).abs().max(), "prediction": (cpu[1] - other[1]).abs().max(),
            "module vs graph": max((result[1] - result[2]).abs().max() for result in (cpu, other))}
    print("max |difference|: " + ", ".join(f"{k} {float(v):.2e}" for k, v in gaps.items()))
    for name, (a, b) in {"losses": (cpu[0], other[0]), "prediction": (cpu[1], other[1])}.items():
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=f"{args.device} vs cpu: {name}")
    for result in (cpu, other):
        np.testing.assert_allclose(result[2].numpy(), result[1].numpy(), rtol=1e-4, atol=1e-5)
    print(f"{args.device} matches cpu to 1e-4")


if __name__ == "__main__":
    main()
