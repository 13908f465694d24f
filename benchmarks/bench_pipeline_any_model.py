"""Pipeline(stages=2) over models whose forward is not a chain of their children (issue 46: cut on their torch.fx
trace, ravop/record/graph_stages.py), evaluated in process, against eager PyTorch's GPipe-equivalent training of the
same model (per batch, each micro-batch's weighted loss backpropagated, one Adam step), in one run, one torch thread:
torchvision's resnet18 (benchmarks/real_models.py's copy, 3x32x32, 10 classes) and the GPT of real_models.py
(dropout 0). Each side's time is the best of `--repeats` runs of `--steps` steps, alternating; the engine's
excludes recording (the trace, the stages scripted: printed apart) and counts evaluating the recorded fit.

    python benchmarks/bench_pipeline_any_model.py [--steps 4] [--repeats 2] [--micro-batches 2]

Columns: seconds per step of each side (eager also with GPipe's re-materialisation: the same cut's stages under
torch.utils.checkpoint, as the engine's backward segments recompute their stage's forward), the engine's over each,
each stage's measured memory (parameters four times, buffers, a micro-batch's saved activations and what crosses the
cut) and the bytes that cross the cut.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as TF
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ravop as R  # noqa: E402
from ravdl.v2 import Pytorch_Model  # noqa: E402
from ravdl.v2.optimizers import Adam  # noqa: E402
from ravop.parallel.data_parallel import tensor_split  # noqa: E402
from ravop.record.graph_stages import graph_cut  # noqa: E402
from ravop.runtime.evaluate import evaluate_persisted  # noqa: E402
from real_models import GPT, VOCAB, _token_loss, resnet18  # noqa: E402

LR = 0.001


def made(make):
    torch.manual_seed(0)
    return make()


def cases(steps):
    g = torch.Generator().manual_seed(1)
    images = (torch.randn(16 * steps, 3, 32, 32, generator=g).numpy(),
              torch.randint(0, 10, (16 * steps,), generator=g).numpy())
    text = torch.randint(0, VOCAB, (8 * steps, 65), generator=g)
    return {"resnet18 3x32x32, batch 16": (lambda: resnet18(num_classes=10), images, 16, "CrossEntropy",
                                           TF.cross_entropy),
            "GPT (2 blocks, d 128, seq 64), batch 8": (
                lambda: GPT(dropout=0.0), (text[:, :-1].numpy(), text[:, 1:].numpy()), 8, _token_loss,
                lambda out, y: TF.cross_entropy(out.view(-1, VOCAB), y.reshape(-1)))}


def eager(make, X, y, batch, micro, loss):
    net = made(make).train()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    start = time.perf_counter()
    for first in range(0, len(X), batch):
        opt.zero_grad()
        for a, b in tensor_split(batch, micro, "micro-batches"):
            rows = slice(first + a, first + b)
            (loss(net(torch.as_tensor(X[rows])), torch.as_tensor(y[rows])) * ((b - a) / batch)).backward()
        opt.step()
    return time.perf_counter() - start


def eager_recomputing(make, X, y, batch, micro, loss):
    """eager() with GPipe's re-materialisation: the same cut's stages (slices of the traced graph) each under
    torch.utils.checkpoint, so each stage's forward runs again in its backward, as the engine's stages do."""
    cut = graph_cut(made(make), torch.as_tensor(X[:batch // micro]))
    cut.gm.load_state_dict(made(make).state_dict())
    stages = [cut.module(a, b) for a, b in R.parallel.Pipeline(2).cut(cut.memory)]
    opt = torch.optim.Adam(cut.gm.parameters(), lr=LR)
    start = time.perf_counter()
    for first in range(0, len(X), batch):
        opt.zero_grad()
        for a, b in tensor_split(batch, micro, "micro-batches"):
            rows = slice(first + a, first + b)
            x = torch.as_tensor(X[rows])
            for stage in stages:
                x = checkpoint(stage, x, use_reentrant=False)
            (loss(x, torch.as_tensor(y[rows])) * ((b - a) / batch)).backward()
        opt.step()
    return time.perf_counter() - start


def engine(make, X, y, batch, micro, loss):
    """(seconds recording, seconds evaluating) of the fit under Pipeline(2, micro)."""
    start = time.perf_counter()
    graph = R.Graph(name="bench pipeline any model", seed=0)
    model = Pytorch_Model(R.model(made(make)))
    model.initialize(Adam(lr=LR))
    model.fit(X, y, 1, batch, loss=loss, strategy=R.parallel.Pipeline(2, micro, resident=False))
    recorded = time.perf_counter()
    evaluate_persisted(graph)
    return recorded - start, time.perf_counter() - recorded


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| model | eager s/step | eager, stages recomputed s/step | Pipeline(2) in process s/step | vs eager "
          "| vs recomputing eager | recording s | stage memory MiB | crossing the cut KiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (make, (X, y), batch, loss, torch_loss) in cases(args.steps).items():
        eager_s, recomputing_s, engine_s, record_s = [], [], [], []
        for _ in range(args.repeats):
            eager_s.append(eager(make, X, y, batch, args.micro_batches, torch_loss) / args.steps)
            recomputing_s.append(eager_recomputing(make, X, y, batch, args.micro_batches, torch_loss) / args.steps)
            recording, evaluating = engine(make, X, y, batch, args.micro_batches, loss)
            record_s.append(recording)
            engine_s.append(evaluating / args.steps)
        cut = graph_cut(made(make), torch.as_tensor(X[:batch // args.micro_batches]))
        stages = R.parallel.Pipeline(2).cut(cut.memory)
        memory = " / ".join(f"{sum(cut.memory[a:b]) / 2**20:.1f}" for a, b in stages)
        print(f"| {name} | {min(eager_s):.3f} | {min(recomputing_s):.3f} | {min(engine_s):.3f} | "
              f"{min(engine_s) / min(eager_s):.2f}x | {min(engine_s) / min(recomputing_s):.2f}x | "
              f"{min(record_s):.1f} | {memory} | {cut.boundary[stages[0][1] - 1] / 1024:.0f} |")


if __name__ == "__main__":
    main()
