"""Recording cost: per forward op (target <= 5 us/op), and the time to record R.grad of a 1k-op graph.

    python benchmarks/bench_grad.py [--repeats 5]

Recording only: nothing is executed. The graphs are an MLP-style chain (linear, relu, tanh, mul, add) and a
CNN-style training step (conv2d, batch_norm, max_pool2d, cross_entropy_loss, R.grad, adam_step).
"""
import argparse
import time

import torch

import ravop as R


def best(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return result, min(times)


def forward_chain(n_ops):
    """A fresh graph with `n_ops` recorded forward ops; returns (graph, weight inputs, loss)."""
    graph = R.Graph(name="bench-grad")
    x = R.t(torch.randn(8, 16))
    weights = [R.t(torch.randn(16, 16) * 0.2) for _ in range(4)]
    start = len(graph.nodes)
    h = x
    while len(graph.nodes) - start < n_ops - 1:
        for w in weights:
            h = R.tanh(R.relu(R.linear(h, w)) * h + x)   # 5 ops: linear relu mul add tanh
    loss = R.sum_to(h, shape=())
    return graph, weights, loss


def time_grad(n_ops, repeats):
    """Seconds to record R.grad over a forward graph of about `n_ops` ops, and the backward ops it adds."""
    times, added, forward = [], 0, 0
    for _ in range(repeats):
        graph, weights, loss = forward_chain(n_ops)
        forward = len(graph.nodes)
        t = time.perf_counter()
        R.grad(loss, weights)
        times.append(time.perf_counter() - t)
        added = len(graph.nodes) - forward
    return forward, added, min(times)


def time_record(name, setup, record, n, repeats):
    """(us per call, us per node added) of `n` calls of `record(*setup())` in a fresh graph, best of `repeats`."""
    def run():
        graph = R.Graph(name=f"bench-{name}")
        inputs = setup()
        before = len(graph.nodes)
        t = time.perf_counter()
        for _ in range(n):
            record(*inputs)
        seconds = time.perf_counter() - t
        return seconds / n * 1e6, seconds / (len(graph.nodes) - before) * 1e6
    run()   # warm caches (dtype promotion, source-file lookups)
    return min(run() for _ in range(repeats))


def _image_inputs():
    return (R.t(torch.randn(8, 3, 16, 16)), R.t(torch.randn(8, 3, 3, 3)), R.t(torch.randn(8)),
            R.t(torch.zeros(3)), R.t(torch.ones(3)))


def _vector_inputs():
    return R.t(torch.randn(32, 64)), R.t(torch.randn(10, 64)), R.t(torch.randn(10)), R.t(torch.tensor([1] * 32))


def _adam_inputs():
    p = R.t(torch.randn(10, 64))
    return p, p, p, p, p


RECORDERS = {   # name: (inputs in a fresh graph, record ops from them)
    "add (x + y)": (_vector_inputs, lambda x, w, b, y: x + x),
    "relu": (_vector_inputs, lambda x, w, b, y: R.relu(x)),
    "linear": (_vector_inputs, lambda x, w, b, y: R.linear(x, w, b)),
    "cross_entropy_loss": (_vector_inputs, lambda x, w, b, y: R.cross_entropy_loss(y, x)),
    "conv2d 'same'": (_image_inputs, lambda x, w, b, m, v: R.conv2d(x, w, b, padding="same")),
    "max_pool2d": (_image_inputs, lambda x, w, b, m, v: R.max_pool2d(x, 2)),
    "batch_norm (3 outputs)": (_image_inputs, lambda x, w, b, m, v: R.batch_norm(x, m, v, v, m)),
    "adam_step (4 outputs)": (_adam_inputs, lambda *s: R.adam_step(*s, step=3)),
}


def cnn_training_step():
    """Record one CNN training step (forward, R.grad, Adam on every param); return the op count."""
    graph = R.Graph(name="bench-cnn-step")
    x, labels = R.t(torch.randn(32, 1, 8, 8)), R.t(torch.randint(0, 10, (32,)))
    shapes = [(16, 1, 3, 3), (16,), (16,), (16,), (10, 16, 4, 4), (10,)]
    params = [R.t(torch.randn(s)) for s in shapes]
    mean, var = R.t(torch.zeros(16)), R.t(torch.ones(16))
    t = time.perf_counter()
    h = R.conv2d(x, params[0], params[1], padding="same")
    h, mean, var = R.batch_norm(h, mean, var, params[2], params[3])
    h = R.max_pool2d(R.relu(h), 2)
    logits = R.conv2d(h, params[4], params[5])
    loss = R.cross_entropy_loss(labels, logits, reshape_target=(-1, 10))
    grads = R.grad(loss, params)
    zeros = R.t(torch.zeros(()))
    for p, g in zip(params, grads):
        R.adam_step(p, g, zeros * p, zeros * p, zeros * p, step=1)
    return time.perf_counter() - t, len(graph.nodes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    print(f"{'forward op recorded':28} {'us/call':>8} {'us/node':>8}   (target <= 5 us/op; a multi-output op "
          "adds one node per output)")
    for name, (setup, record) in RECORDERS.items():
        per_call, per_node = time_record(name, setup, record, 2000, args.repeats)
        print(f"{name:28} {per_call:8.2f} {per_node:8.2f}")

    print(f"\n{'R.grad of':28} {'fwd ops':>8} {'bwd ops':>8} {'ms':>8} {'us/fwd op':>10}")
    for n in (1_000, 10_000):
        forward, added, seconds = time_grad(n, args.repeats)
        print(f"{'MLP-style chain':28} {forward:8d} {added:8d} {seconds * 1e3:8.2f} {seconds / forward * 1e6:10.2f}")

    seconds, n_ops = min(cnn_training_step() for _ in range(args.repeats))
    print(f"\nCNN training step (forward + R.grad + Adam on 6 params): {n_ops} ops recorded in "
          f"{seconds * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
