"""R.parallel's strategies on 1 and 2 worker processes, against eager PyTorch, in one run: an MLP 784-1024-1024-10
(relu, cross entropy, Adam) at batch 256 on synthetic MNIST-shaped data.

    python benchmarks/bench_parallel.py [--steps 64] [--threads 1] [--repeats 2] [--only DiLoCo]

Rows: plain fit on 1 worker; LocalSGD(replicas=2, sync_every=8), DataParallel(2), Pipeline(2, micro_batches=4)
as segments (of the NeuralNetwork, and of the nn.Module as a Pytorch_Model, cut into stages of its children) and
with resident stages (2 workers only: on one they would take turns),
DiLoCo(2, inner_steps=8) and DiLoCo(2, 8, compression='int8', overlap=True) on 1 and 2 workers each; eager
PyTorch (one process, the same model and batches), and for each DiLoCo row the same algorithm in eager PyTorch
(its replicas one after the other in one process: its "vs eager" ratio and losses compare with that). samples/s counts every sample a replica trains
on, over the engine's execute time (R.execute until the graph is done: the time the workers work). "speed-up" is
the 2-worker run over the 1-worker run of the same strategy (target for LocalSGD: >= 1.7x), to read beside the
ceiling printed first: eager PyTorch in two processes at once over one, what two workers can gain at all while
other jobs share the cores. DataParallel's, Pipeline's and plain fit's losses are compared with eager (the
same mathematics); LocalSGD's are not (its replicas see other batches) and show as '-'; DiLoCo's are compared
with eager DiLoCo's.
"""
import argparse
import contextlib
import io
import multiprocessing
import sys
import time
import uuid
from pathlib import Path

import torch
import torch.nn.functional as TF
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ravop as R  # noqa: E402
from bench_ravdl import Workers, mnist_data  # noqa: E402
from ravdl.v2 import NeuralNetwork, Pytorch_Model  # noqa: E402
from ravdl.v2.layers import Activation, Dense  # noqa: E402
from ravdl.v2.optimizers import Adam  # noqa: E402
from ravop.local.embedded import LocalServer  # noqa: E402

BATCH, WIDTH, SEED = 256, 1024, 0


def torch_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10))


def ravdl_mlp(net):
    model = NeuralNetwork(optimizer=Adam(lr=0.001), loss="CrossEntropy")
    linears = [m for m in net if isinstance(m, nn.Linear)]
    for k, linear in enumerate(linears):
        model.add(Dense(linear.out_features, input_shape=(linear.in_features,) if k == 0 else None,
                        initial_W=linear.weight.detach().numpy(), initial_w0=linear.bias.detach().numpy()))
        if k < len(linears) - 1:
            model.add(Activation("relu"))
    return model


def eager(X, y, steps):
    """(seconds, losses) of plain PyTorch over the first `steps` batches, in order."""
    net = torch_mlp()
    opt = torch.optim.Adam(net.parameters(), lr=0.001)
    X, y = torch.from_numpy(X), torch.from_numpy(y)
    losses = []
    start = time.perf_counter()
    for k in range(steps):
        rows = slice(k * BATCH, (k + 1) * BATCH)
        loss = TF.cross_entropy(net(X[rows]), y[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return time.perf_counter() - start, torch.stack(losses)


def _eager_send(x, residual, kind):
    """ravop.parallel.compression.send in eager torch."""
    true = x if residual is None else x + residual
    if kind == "fp16":
        received = true.clamp(-65504.0, 65504.0).half().float()
    else:
        scale = true.abs().max() * (1.0 / 127.0)
        scale = scale + (scale == 0).float()
        received = torch.clamp(torch.round(true / scale), -127, 127).to(torch.int8).float() * scale
    return received, true - received


def eager_diloco(X, y, steps, strategy):
    """(seconds, losses by name) of `strategy` (an R.parallel.DiLoCo) in eager PyTorch: replicas on shards in
    order, each with its own Adam, torch.optim.SGD over the averaged pseudo-gradients, as ravop.parallel.diloco."""
    n = strategy.replicas
    nets = [torch_mlp() for _ in range(n)]
    glob = torch_mlp()
    opts = [torch.optim.Adam(net.parameters(), lr=0.001) for net in nets]
    outer = torch.optim.SGD(glob.parameters(), lr=strategy.outer_lr, momentum=strategy.outer_momentum,
                            nesterov=strategy.nesterov)
    X, y = torch.from_numpy(X), torch.from_numpy(y)
    size = steps * BATCH // n
    per_replica = steps // n
    kind = strategy.compression
    up = [[None] * len(list(glob.parameters())) for _ in range(n)]
    down = [None] * len(up[0])
    start_params = [p.detach().clone() for p in glob.parameters()]
    losses = {}
    start = time.perf_counter()
    for k in range(per_replica):
        for r, (net, opt) in enumerate(zip(nets, opts)):
            rows = slice(r * size + k * BATCH, r * size + (k + 1) * BATCH)
            loss = TF.cross_entropy(net(X[rows]), y[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[f"training_loss_epoch_1_batch_{k * n + r + 1}"] = loss.item()
        if (k + 1) % strategy.inner_steps and k + 1 != per_replica:
            continue
        before = [p.detach().clone() for p in glob.parameters()]
        for i, p in enumerate(glob.parameters()):
            pseudo = [start_params[i] - list(net.parameters())[i].detach() for net in nets]
            if kind:
                for r in range(n):
                    pseudo[r], up[r][i] = _eager_send(pseudo[r], up[r][i], kind)
            p.grad = torch.stack(pseudo).mean(0)
        outer.step()
        with torch.no_grad():
            if kind:
                for i, p in enumerate(glob.parameters()):
                    received, down[i] = _eager_send(p - before[i], down[i], kind)
                    p.copy_(before[i] + received)
            start_params = before if strategy.overlap else [p.detach().clone() for p in glob.parameters()]
            for net in nets:
                for p, s in zip(net.parameters(), start_params):
                    p.copy_(s)
    return time.perf_counter() - start, losses


def _eager_seconds(args):
    torch.set_num_threads(args[1])
    return eager(*mnist_data(args[0] * BATCH), args[0])[0]


def machine_ceiling(steps, threads):
    """The speed-up two processes can get on this machine now: eager PyTorch in two processes at once, their
    samples/s over one process's (2.0 on two idle cores; less when other jobs share them)."""
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        alone = pool.apply(_eager_seconds, ((steps, threads),))
        start = time.perf_counter()
        pool.map(_eager_seconds, [(steps, threads)] * 2)
        both = time.perf_counter() - start
    return 2 * alone / both


def module_mlp():
    """The MLP as a Pytorch_Model of the nn.Module itself (Pipeline cuts it into stages of its children)."""
    model = Pytorch_Model(R.model(torch_mlp()))
    model.initialize(Adam(lr=0.001))
    return model


def engine(X, y, strategy, as_module=False):
    """(execute seconds, losses in name order, summary) of one fit on the running workers; `as_module`: the MLP as
    a Pytorch_Model instead of a NeuralNetwork."""
    R.flush()
    R.Graph(name=f"bench {strategy!r}", seed=SEED)
    with contextlib.redirect_stdout(io.StringIO()):
        fit = module_mlp().fit if as_module else ravdl_mlp(torch_mlp()).fit
        names = fit(X, y, n_epochs=1, batch_size=BATCH, strategy=strategy)
    summary = R.activate()
    start = time.perf_counter()
    R.execute()
    R.track_progress(progress_bar=False)
    seconds = time.perf_counter() - start
    losses = R.fetch_losses()
    return seconds, {name: float(value) for name, value in zip(names, losses.batch)}, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64, help="batches of 256 in the epoch (all replicas)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs per row")
    parser.add_argument("--only", default="", help="run only the rows whose label contains this")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    X, y = mnist_data(args.steps * BATCH)
    eager_s, eager_losses = eager(X, y, args.steps)
    ceiling = machine_ceiling(args.steps, args.threads)
    strategies = [("fit", None), ("LocalSGD(2, sync_every=8)", R.parallel.LocalSGD(2, 8)),
                  ("DataParallel(2)", R.parallel.DataParallel(2)),
                  ("Pipeline(2, micro_batches=4)", R.parallel.Pipeline(2, 4, resident=False)),
                  ("Pipeline(2, micro_batches=4) nn.Module", R.parallel.Pipeline(2, 4, resident=False)),
                  ("Pipeline(2, micro_batches=4) resident", R.parallel.Pipeline(2, 4, resident=True)),
                  ("DiLoCo(2, 8)", R.parallel.DiLoCo(2, 8)),
                  ("DiLoCo(2, 8, int8, overlap)", R.parallel.DiLoCo(2, 8, compression="int8", overlap=True))]
    strategies = [(label, strategy) for label, strategy in strategies if args.only in label]
    references = {label: min((eager_diloco(X, y, args.steps, strategy) for _ in range(args.repeats)),
                             key=lambda run: run[0])
                  for label, strategy in strategies if isinstance(strategy, R.parallel.DiLoCo)}
    server = LocalServer()
    rows, results = [], {}
    try:
        R.initialize(token=f"bench-{uuid.uuid4().hex[:6]}", redis_url=server.url)
        for n_workers in (1, 2):
            workers = Workers(server.url, n_workers, args.threads)
            try:
                for label, strategy in strategies:
                    if (label == "fit" and n_workers == 2) or (label.endswith("resident") and n_workers == 1):
                        continue   # resident stages on one worker would take turns, handing back every step
                    runs = [engine(X, y, strategy, label.endswith("nn.Module")) for _ in range(args.repeats)]
                    seconds, losses, summary = min(runs, key=lambda run: run[0])
                    results[label, n_workers] = seconds
                    rows.append((label, n_workers, seconds, losses, summary))
            finally:
                workers.stop()
    finally:
        server.stop()
    samples = args.steps * BATCH
    print(f"MLP 784-{WIDTH}-{WIDTH}-10, batch {BATCH}, {args.steps} batches, --threads {args.threads}; the machine "
          "was shared with other jobs")
    print(f"two eager processes at once: {ceiling:.2f}x one (the most 2 workers can gain on this machine now)")
    print(f"{'run':<40}{'workers':>8}{'seconds':>9}{'samples/s':>11}{'vs eager':>10}{'speed-up':>10}  "
          f"{'subgraphs':>9}  max |loss - eager|")
    print(f"{'eager PyTorch':<40}{1:>8}{eager_s:>9.2f}{samples / eager_s:>11.0f}{1.0:>10.2f}{'':>10}")
    for label, (seconds, _) in references.items():
        print(f"{'eager ' + label:<40}{1:>8}{seconds:>9.2f}{samples / seconds:>11.0f}{1.0:>10.2f}{'':>10}")
    for label, n_workers, seconds, losses, summary in rows:
        speedup = results[label, 1] / seconds if n_workers == 2 and (label, 1) in results else None
        names = [f"training_loss_epoch_1_batch_{b + 1}" for b in range(args.steps)]
        got = torch.tensor([losses[name] for name in names])
        base_s = eager_s
        if label == "LocalSGD(2, sync_every=8)":   # each shard's first 8 steps are eager's steps on that shard
            diff = None
        elif label in references:
            base_s, want = references[label]
            diff = float((got - torch.tensor([want[name] for name in names])).abs().max())
        else:
            diff = float((got - eager_losses).abs().max())
        print(f"{label:<40}{n_workers:>8}{seconds:>9.2f}{samples / seconds:>11.0f}{base_s / seconds:>10.2f}"
              f"{'' if speedup is None else f'{speedup:.2f}x':>10}  {summary['subgraphs']:>9}  "
              f"{'-' if diff is None else f'{diff:.2e}'}")


if __name__ == "__main__":
    main()
