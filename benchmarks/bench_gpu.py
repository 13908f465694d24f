"""Training throughput of a PyTorch model through the engine (Pytorch_Model, one local worker on the
device) against the same training loop in eager PyTorch on the same device, in one run.

    python benchmarks/bench_gpu.py [--device cuda|cpu] [--models mlp,cnn] [--steps 30] [--batch 256]

`--device cuda` (the default when a GPU is visible) records the graph with gpu_required='yes' and starts the
embedded worker with `--device cuda`; on a machine without a GPU it compares the CPU worker with eager CPU.
Both sides run torch.optim.Adam's fused update (fused=True on both: ravdl's Adam(fused=True)) so their losses can be checked
against each other, and on a GPU the same float32 math (no TF32, deterministic cuDNN: what a worker uses,
`worker.execute.device.use_full_precision`); the engine's time is split into record, compile+upload, execute and
fetch.
"""
import argparse
import copy
import time

import torch
import torch.nn.functional as TF
from torch import nn

from ravdl.v2 import Pytorch_Model
from ravdl.v2.optimizers import Adam
import ravop as R
from worker.execute.device import use_full_precision

LR = 1e-3


class Mlp(nn.Module):
    """A 784-2048-2048-10 MLP (about 5.8 M parameters) on flattened 28x28 inputs."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                                    nn.Linear(2048, 10))

    def forward(self, x):
        return self.layers(x)


class Cnn(nn.Module):
    """A CIFAR-sized CNN: three conv blocks with BatchNorm, then a linear classifier."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(128 * 4 * 4, 10)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


MODELS = {"mlp": (Mlp, (784,)), "cnn": (Cnn, (3, 32, 32))}


def make_batches(input_shape, steps, batch, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, *input_shape, generator=generator),
             torch.randint(0, 10, (batch,), generator=generator)) for _ in range(steps)]


def synchronize(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_eager(net, batches, device):
    """Wall time of the training loop in eager PyTorch, data moved to the device per step as a loader would."""
    net = copy.deepcopy(net).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, fused=True)
    synchronize(device)
    start = time.perf_counter()
    losses = []
    for x, y in batches:
        loss = TF.cross_entropy(net(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    losses = torch.stack(losses).cpu()
    synchronize(device)
    return losses, time.perf_counter() - start


def run_engine(net, batches, device):
    """Record, compile and upload, execute, fetch every loss: (losses, {phase: seconds})."""
    R.flush()
    start = time.perf_counter()
    R.Graph(name="bench_gpu", gpu_required="yes" if device.startswith("cuda") else "no")
    model = Pytorch_Model(R.model(net))
    model.initialize(Adam(lr=LR, fused=True))
    for i, (x, y) in enumerate(batches):
        loss = R.cross_entropy_loss(R.t(y), model._forward_pass(R.t(x)))
        model._backward_pass(loss)
        loss.persist_op(f"loss_{i}")
    recorded = time.perf_counter()
    R.activate()
    compiled = time.perf_counter()
    R.execute()
    R.track_progress(progress_bar=False)
    executed = time.perf_counter()
    losses = torch.stack([R.fetch_persisting_op(f"loss_{i}") for i in range(len(batches))])
    fetched = time.perf_counter()
    return losses, {"record": recorded - start, "compile": compiled - recorded, "execute": executed - compiled,
                    "fetch": fetched - executed, "total": fetched - start}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs per side")
    args = parser.parse_args()

    R.initialize(workers=1, device=args.device)
    use_full_precision(torch.device(args.device))
    rows = []
    for name in args.models.split(","):
        model_class, input_shape = MODELS[name]
        torch.manual_seed(0)
        net = model_class()
        batches = make_batches(input_shape, args.steps, args.batch)
        eager_losses, eager_s = min((run_eager(net, batches, args.device) for _ in range(args.repeats)),
                                    key=lambda run: run[1])
        engine_losses, phases = min((run_engine(net, batches, args.device) for _ in range(args.repeats)),
                                    key=lambda run: run[1]["total"])
        gap = float((engine_losses - eager_losses).abs().max())
        samples = args.steps * args.batch
        rows.append((name, args.device, args.steps, args.batch, eager_s, phases, samples / eager_s,
                     samples / phases["total"], phases["total"] / eager_s, gap))

    header = ("model", "device", "steps", "batch", "eager s", "engine s", "record", "compile", "execute",
              "fetch", "eager samples/s", "engine samples/s", "engine/eager", "max |loss gap|")
    table = [header] + [(n, d, str(s), str(b), f"{e:.3f}", f"{p['total']:.3f}", f"{p['record']:.3f}",
                         f"{p['compile']:.3f}", f"{p['execute']:.3f}", f"{p['fetch']:.3f}", f"{es:,.0f}",
                         f"{gs:,.0f}", f"{ratio:.2f}x", f"{gap:.1e}")
                        for n, d, s, b, e, p, es, gs, ratio, gap in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
