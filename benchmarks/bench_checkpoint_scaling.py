"""Loop checkpoints as the model grows (issue 46): an MLP `Pytorch_Model` of ~10M, ~40M and ~100M parameters
(three Linear(w, w) and a Linear(w, 10), ReLUs between; ravdl's fused Adam: 12 bytes of state per parameter)
trained by `.fit` for a few dozen steps on the embedded server (R.initialize()), each on one fresh worker of one
torch thread: with checkpoints off (`--checkpoint-steps 0 --checkpoint-seconds 1e9`), then with the worker's
default checkpoints, `--repeats` times in turn (the best s/step of each kept: the machine is shared). Against
eager PyTorch's training of the same model in a process of its own (torch.optim.Adam(fused=True), one thread,
best of `--repeats`). Per size:

- s/step of the loop (from its claim to its end) with checkpoints and without, and their ratio; the loop's
  stall in its checkpoint copies (the `copied` seconds its checkpoint record shows, over the loop's seconds);
- checkpoints written (their steps seen in the checkpoint record, polled every 20 ms) and the bytes that went
  into the server during the loop (INFO's total_net_input_bytes, less the run without checkpoints');
- the worker's peak RSS above its idle RSS (VmHWM) in bytes per parameter, with and without checkpoints, and
  eager's (peak above its RSS before the model was made), and their ratio; eager's s/step and the engine's
  against it.

    python benchmarks/bench_checkpoint_scaling.py [--sizes 10M,40M,100M] [--steps-scale 1.0] [--repeats 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import numpy as np
import torch
from torch import nn

WIDTHS = {"10M": 1826, "40M": 3652, "100M": 5780}   # 3w^2 + 11w parameters
STEPS = {"10M": 150, "40M": 80, "100M": 40}          # ~20-40 s of loop each on one thread
BATCH, CLASSES, SEED = 8, 10, 0
OFF = ["--checkpoint-steps", "0", "--checkpoint-seconds", "1e9"]


def mlp(width: int) -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, CLASSES))


def data(width: int, steps: int):
    g = torch.Generator().manual_seed(SEED)
    return torch.randn(steps * BATCH, width, generator=g), torch.randint(0, CLASSES, (steps * BATCH,), generator=g)


def status_bytes(pid, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status (Linux only)")


def eager(width: int, steps: int) -> dict:
    """This process trains the model eagerly: s/step (the first step aside) and peak RSS above the RSS before
    the model was made."""
    torch.set_num_threads(1)
    X, y = data(width, steps)
    before = status_bytes("self", "VmRSS")
    model = mlp(width)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    times = []
    for i in range(steps):
        began = time.perf_counter()
        rows = slice(i * BATCH, (i + 1) * BATCH)
        loss = nn.functional.cross_entropy(model(X[rows]), y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - began)
    return {"s_per_step": float(np.mean(times[1:])), "peak": status_bytes("self", "VmHWM") - before}


class Watch:
    """Polls the loop of graph `keys` every 20 ms: when it was claimed and ended, the checkpoint steps seen, the
    server's input bytes at its claim and end."""

    def __init__(self, client, keys):
        self.client, self.keys = client, keys
        self.claimed = self.ended = self.bytes_at_claim = self.bytes_at_end = None
        self.checkpoints = []
        self.copied = 0.0   # seconds the loop spent in checkpoint copies, as of its last checkpoint
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _net_in(self) -> int:
        return int(self.client.info("stats")["total_net_input_bytes"])

    def _run(self):
        client, keys = self.client, self.keys
        loop = None
        while loop is None:
            loop = next(iter(client.hkeys(keys.taken)), None)
            time.sleep(0.005)
        self.claimed, self.bytes_at_claim = time.monotonic(), self._net_in()
        loop = loop.decode()
        while not client.sismember(keys.done, loop):
            step, copied = client.hmget(keys.checkpoint(loop), "step", "copied")
            if step is not None and (not self.checkpoints or self.checkpoints[-1] != int(step)):
                self.checkpoints.append(int(step))
                self.copied = float(copied or "nan")   # nan: a worker that does not record them
            time.sleep(0.02)
        self.ended, self.bytes_at_end = time.monotonic(), self._net_in()


def engine(R, session, width: int, steps: int, flags) -> dict:
    """One fit of the model on a fresh worker started with `flags`: its loop's s/step, checkpoints, bytes into the
    server, the worker's peak RSS above its idle RSS."""
    from ravdl.v2 import Pytorch_Model
    from ravdl.v2.optimizers import Adam
    from ravop.local.embedded import start_worker
    from ravop.store import GraphKeys
    from ravop.store.keys import worker_key

    name = f"bench-ckpt-{uuid.uuid4().hex[:6]}"
    log = os.path.join(tempfile.gettempdir(), f"{name}.log")
    proc = start_worker(session.url, name, "cpu", threads=1, log_path=log, extra_args=list(flags))
    try:
        while not session.client.exists(worker_key(name)):
            assert proc.poll() is None, open(log).read()[-2000:]
            time.sleep(0.05)
        time.sleep(1.0)
        idle = status_bytes(proc.pid, "VmRSS")
        X, y = data(width, steps)
        graph = R.Graph(name=f"checkpoints {width}", seed=SEED)
        model = Pytorch_Model(R.model(mlp(width)))
        model.initialize(Adam(lr=1e-3, fused=True))
        model.fit(X.numpy(), y.numpy(), n_epochs=1, batch_size=BATCH, loss="CrossEntropy", shuffle=False)
        R.activate()
        watch = Watch(session.client, GraphKeys(session.token, graph.id))
        R.execute()
        R.track_progress(progress_bar=False)
        watch.thread.join()
        peak = status_bytes(proc.pid, "VmHWM") - idle
    finally:
        proc.terminate()
        proc.wait()
    R.flush()
    return {"s_per_step": (watch.ended - watch.claimed) / steps, "checkpoints": len(watch.checkpoints),
            "stall": watch.copied / (watch.ended - watch.claimed),
            "net_in": watch.bytes_at_end - watch.bytes_at_claim, "peak": peak}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10M,40M,100M")
    parser.add_argument("--steps-scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--eager", nargs=2, type=int, metavar=("WIDTH", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.eager:
        print(json.dumps(eager(*args.eager)))
        return
    import ravop as R
    session = R.initialize(token="bench-checkpoint-scaling", workers=0)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; the worker and eager: one thread")
    print("| params | steps | s/step ckpt / off | ratio | stall | checkpoints | GB into server | worker B/param "
          "ckpt / off | eager B/param | ckpt/eager memory | eager s/step | engine/eager time |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        width, steps = WIDTHS[size], max(4, round(STEPS[size] * args.steps_scale))
        params = sum(p.numel() for p in mlp(width).parameters())
        offs, ons, eagers = [], [], []
        for _ in range(args.repeats):
            offs.append(engine(R, session, width, steps, OFF))
            ons.append(engine(R, session, width, steps, ()))
            eagers.append(json.loads(subprocess.run([sys.executable, __file__, "--eager", str(width), str(steps)],
                                                    check=True, capture_output=True, text=True).stdout))
        off, on, eager_run = (min(runs, key=lambda run: run["s_per_step"]) for runs in (offs, ons, eagers))
        print(f"  {size}: ckpt s/step {[round(r['s_per_step'], 3) for r in ons]}, stall "
              f"{[round(r['stall'], 3) for r in ons]}, checkpoints {[r['checkpoints'] for r in ons]}; off "
              f"{[round(r['s_per_step'], 3) for r in offs]}; eager {[round(r['s_per_step'], 3) for r in eagers]}",
              flush=True)
        print(f"| {params / 1e6:.1f}M | {steps} | {on['s_per_step']:.3f} / {off['s_per_step']:.3f} | "
              f"{on['s_per_step'] / off['s_per_step']:.2f}x | {on['stall']:.1%} | "
              f"{on['checkpoints']} | {(on['net_in'] - off['net_in']) / 1e9:.2f} | "
              f"{on['peak'] / params:.1f} / {off['peak'] / params:.1f} | {eager_run['peak'] / params:.1f} | "
              f"{on['peak'] / eager_run['peak']:.2f}x | {eager_run['s_per_step']:.3f} | "
              f"{on['s_per_step'] / eager_run['s_per_step']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
