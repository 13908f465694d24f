"""DiLoCo's outer settings for the WAN lab's task, found without the lab: the lab's task (benchmarks/wan/harness.py:
the MLP 784-256-10, Adam(lr=0.001), cross entropy, batch 128, shards in order, no shuffle) trained by DiLoCo in
eager PyTorch, in one process, with the replicas batched by torch.func.vmap (tests/parallel/test_diloco_sweep.py checks it
against the eager reference tests/parallel/test_diloco.py checks R.parallel.DiLoCo with), and the final test accuracy
set beside one-worker training on the same samples (the lab's "1w acc").

    python -m benchmarks.wan.overlap_sweep --inner-steps 128 --outer-lr 0.5 --outer-momentum 0.5 --overlap
    python -m benchmarks.wan.overlap_sweep --overlap --inner-steps 128 --mode restart local eager

`mode`: 'restart' is R.parallel.DiLoCo's overlap=True (every replica restarts from the global model one outer step
old); 'eager' is the eager update of arXiv 2502.12996 measured for comparison: at sync k each replica applies, to
the global model it holds (after k - 1 outer steps), the outer optimizer's step with its own fresh
pseudo-gradient standing in for its share of the round's mean and the others' pseudo-gradients of the round
before for theirs, and restarts from that; the global model itself still takes outer step k with round k's mean.
'local' is overlap_start='local' (each replica restarts from the stale global model minus `mix` times its own
pseudo-gradient as received; mix=1 is R.parallel.DiLoCo's).
"""
import argparse
import copy
import itertools
import json
import sys
import time

import torch
import torch.nn.functional as TF
from torch.func import functional_call, grad, vmap

from .harness import one_worker_baseline, task_data, torch_mlp

BETAS, EPS = (0.9, 0.999), 1e-8
MODES = ("restart", "eager", "local")


def compress(x, residual, kind):
    """(received, residual) of ravop.parallel.compression.send in eager torch (error feedback: the residual is
    added before compressing and what compression lost is the next residual); `x` may hold one tensor per replica
    on dim 0 when `per_replica` scales are wanted (see _per_replica)."""
    true = x if residual is None else x + residual
    if kind is None:
        return true, None
    if kind == "fp16":
        received = true.clamp(-65504.0, 65504.0).half().float()
    elif kind == "int8":
        scale = true.abs().max() * (1.0 / 127.0)
        scale = scale + (scale == 0).float()
        received = torch.clamp(torch.round(true / scale), -127, 127).to(torch.int8).float() * scale
    else:
        raise ValueError(f"compression is None, 'fp16' or 'int8', not {kind!r}")
    return received, true - received


def _per_replica(stacked, residuals, kind):
    """compress() of each replica's tensor (dim 0) with its own scale and residual."""
    pairs = [compress(stacked[r], residuals[r], kind) for r in range(stacked.shape[0])]
    return torch.stack([p[0] for p in pairs]), [p[1] for p in pairs]


class BatchedAdam:
    """torch.optim.Adam's single-tensor update on tensors holding one replica per row of dim 0 (every replica
    steps at once, so one step count serves all)."""

    def __init__(self, params, lr):
        self.lr, self.step_count = lr, 0
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]

    def step(self, params, grads):
        self.step_count += 1
        beta1, beta2 = BETAS
        correction1, correction2 = 1 - beta1 ** self.step_count, 1 - beta2 ** self.step_count
        for p, g, m, v in zip(params, grads, self.exp_avg, self.exp_avg_sq):
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / correction2 ** 0.5).add_(EPS)
            p.addcdiv_(m, denom, value=-(self.lr / correction1))


def simulate(net, X, y, replicas, inner_steps, epochs, batch, lr=0.001, outer_lr=0.7, outer_momentum=0.9,
             nesterov=True, compression=None, overlap=False, mode="restart", mix=1.0, loss="cross_entropy"):
    """The global model (a copy of `net`) after DiLoCo over (X, y): replica r trains on rows
    [r * size, (r + 1) * size) in order, batches of `batch`, Adam(lr); every `inner_steps` steps and after the
    last one, outer SGD on the mean pseudo-gradient, compressed with error feedback both ways, as
    tests/parallel/test_diloco.py's diloco_reference (`overlap`: the one-round-delayed outer step of R.parallel.DiLoCo,
    or with mode='eager' the eager update described in the module docstring). Nets without buffers only."""
    if mode not in MODES:
        raise ValueError(f"mode is one of {', '.join(MODES)}, not {mode!r}")
    if list(net.buffers()):
        raise ValueError("the sweep's nets carry no buffers (BatchNorm is not simulated)")
    loss_of = {"cross_entropy": TF.cross_entropy, "mse": TF.mse_loss}[loss]
    names = [name for name, _ in net.named_parameters()]
    glob = copy.deepcopy(net)
    glob_params = list(glob.parameters())
    outer = torch.optim.SGD(glob_params, lr=outer_lr, momentum=outer_momentum, nesterov=nesterov)
    params = [p.detach().unsqueeze(0).repeat(replicas, *[1] * p.dim()).clone() for p in glob_params]
    adam = BatchedAdam(params, lr)
    size = len(X) // replicas
    Xs = torch.as_tensor(X[:size * replicas]).reshape(replicas, size, *X.shape[1:])
    ys = torch.as_tensor(y[:size * replicas]).reshape(replicas, size, *y.shape[1:])

    def replica_loss(p, X_batch, y_batch):
        return loss_of(functional_call(net, dict(zip(names, p)), (X_batch,)), y_batch)

    step_grads = vmap(grad(replica_loss))
    starts = [p.detach().clone() for p in glob_params]
    up = [[None] * replicas for _ in glob_params]
    down = [None] * len(glob_params)
    previous = None      # mode='eager': round k-1's decompressed pseudo-gradients, per replica
    eager_buffers = None   # ... and the outer momentum after step k - 1, as every replica can track it
    per_epoch = -(-size // batch)
    n = per_epoch * epochs
    for k in range(n):
        first = (k % per_epoch) * batch
        grads = step_grads(params, Xs[:, first:first + batch], ys[:, first:first + batch])
        adam.step(params, grads)
        if (k + 1) % inner_steps and k + 1 != n:
            continue
        before = [p.detach().clone() for p in glob_params]
        received = []
        for i, p in enumerate(glob_params):
            pseudo, up[i] = _per_replica(starts[i] - params[i], up[i], compression)
            received.append(pseudo)
            p.grad = pseudo.mean(0)
        outer.step()
        if compression:
            with torch.no_grad():
                for i, p in enumerate(glob_params):
                    sent, down[i] = compress(p - before[i], down[i], compression)
                    p.copy_(before[i] + sent)
        if not overlap:
            starts = [p.detach().clone() for p in glob_params]
            restart = [s.unsqueeze(0).expand_as(q) for s, q in zip(starts, params)]
        elif mode == "restart":
            starts = before
            restart = [s.unsqueeze(0).expand_as(q) for s, q in zip(starts, params)]
        elif mode == "local":   # the stale global model plus `mix` times the replica's own fresh progress
            restart = [b.unsqueeze(0) - mix * g for b, g in zip(before, received)]
            starts = [r.clone() for r in restart]
        else:
            restart, eager_buffers = _eager_restarts(before, received, previous, eager_buffers, outer_lr,
                                                     outer_momentum, nesterov)
            previous = received
            starts = [r.clone() for r in restart]
        with torch.no_grad():
            for q, s in zip(params, restart):
                q.copy_(s)
    return glob


def _eager_restarts(global_before, pseudo, previous, buffers, outer_lr, outer_momentum, nesterov):
    """Each replica's start for the next round under eager updates (arXiv 2502.12996): at sync k it holds the
    global model after k - 1 outer steps and the outer optimizer's momentum of that step (every replica can keep
    it: it is the stale means' momentum), and steps them with a stand-in for round k's mean: its own fresh
    pseudo-gradient for its 1/R share and the others' of round k - 1 for theirs. Returns the per-replica starts
    (dim 0) and the momentum buffers after step k - 1."""
    replicas = pseudo[0].shape[0]
    starts, after = [], []
    for i, (base, fresh) in enumerate(zip(global_before, pseudo)):
        stale = previous[i] if previous is not None else None
        buf = None
        if stale is not None and outer_momentum:   # torch's SGD: buf = g at its first step, then m * buf + g
            mean = stale.mean(0)
            buf = mean if buffers is None else outer_momentum * buffers[i] + mean
        after.append(buf)
        others = (stale.sum(0, keepdim=True) - stale) if stale is not None else torch.zeros_like(fresh)
        estimate = (fresh + others) / replicas
        if outer_momentum:
            step_buf = estimate if buf is None else outer_momentum * buf.unsqueeze(0) + estimate
            step = estimate + outer_momentum * step_buf if nesterov else step_buf
        else:
            step = estimate
        starts.append(base.unsqueeze(0) - outer_lr * step)
    return starts, (after if previous is not None and outer_momentum else buffers)


def accuracy(net, X, y):
    with torch.no_grad():
        return float((net(torch.as_tensor(X)).argmax(1) == torch.as_tensor(y)).float().mean())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--epochs", type=int, default=256)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--inner-steps", type=int, nargs="+", default=[128])
    parser.add_argument("--outer-lr", type=float, nargs="+", default=[0.7])
    parser.add_argument("--outer-momentum", type=float, nargs="+", default=[0.9])
    parser.add_argument("--nesterov", choices=("yes", "no"), nargs="+", default=["yes"])
    parser.add_argument("--compression", default="int8", help="int8, fp16 or none")
    parser.add_argument("--overlap", action="store_true")
    parser.add_argument("--mode", choices=MODES, nargs="+", default=["restart"])
    parser.add_argument("--mix", type=float, nargs="+", default=[1.0],
                        help="mode 'local': the share of its own fresh progress a replica restarts with")
    parser.add_argument("--baseline", action="store_true", help="also train the one-worker baseline")
    parser.add_argument("--json", help="append one JSON line per setting to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    X, y, X_test, y_test = task_data(args.rows)
    compression = None if args.compression == "none" else args.compression
    if args.baseline:
        base = one_worker_baseline(X, y, X_test, y_test, 256, args.batch, args.epochs)
        print(f"one worker: accuracy {base['test_accuracy']:.4f}", flush=True)
    for inner, lr, momentum, nesterov, mode, mix in itertools.product(
            args.inner_steps, args.outer_lr, args.outer_momentum, args.nesterov, args.mode, args.mix):
        nesterov = nesterov == "yes" and momentum > 0
        began = time.monotonic()
        glob = simulate(torch_mlp(256), X, y, args.replicas, inner, args.epochs, args.batch, outer_lr=lr,
                        outer_momentum=momentum, nesterov=nesterov, compression=compression, overlap=args.overlap,
                        mode=mode, mix=mix)
        row = {"replicas": args.replicas, "inner_steps": inner, "outer_lr": lr, "outer_momentum": momentum,
               "nesterov": nesterov, "compression": compression, "overlap": args.overlap, "mode": mode,
               "mix": mix if mode == "local" else None,
               "rows": args.rows, "epochs": args.epochs, "test_accuracy": accuracy(glob, X_test, y_test),
               "seconds": time.monotonic() - began}
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as out:
                out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
