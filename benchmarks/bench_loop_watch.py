"""What following the graph costs a running loop (worker/loops/graph_watch.py): the time per step of a small MLP's fit
(the loop a worker runs, `ravop.runtime.loop_run.LoopRun`) with a thread beside it reading the graph's state from a real
server every 0.25 s and the step's check of what it read, against the same loop with neither, and against eager
PyTorch's step of the same model, in one run. Rounds alternate, best of each is kept.

    python benchmarks/bench_loop_watch.py [--steps 3000] [--rounds 5] [--interval 0.25]
"""
import argparse
import time

import numpy as np
import torch

from compiler import compile_graph
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.local.embedded import LocalServer
from ravop.runtime.loop_run import LoopRun
from ravop.store import GraphKeys, connect
from ravop.wire import unpack_loop, unpack_nodes
from worker.loops.graph_watch import GraphWatch

ROWS, BATCH, FEATURES = 256, 32, 16


def fit_loop(steps):
    """A LoopRun of `steps` steps of a small MLP's Adam training (8 steps an epoch)."""
    graph = R.Graph(name="watched", seed=1)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = X[:, :1] - X[:, 1:2]
    net = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    net.add(Dense(64, input_shape=(FEATURES,)))
    net.add(Activation("relu"))
    net.add(Dense(1))
    net.fit(X, y, n_epochs=steps * BATCH // ROWS, batch_size=BATCH, persist_weights=True)
    compiled = compile_graph(graph)
    [sub] = [s for s in compiled.plan.subgraphs if s.HasField("loop")]
    inputs = [compiled.constants[i] for i in unpack_nodes(sub.nodes)[0].inputs]
    return LoopRun(unpack_loop(sub.loop), inputs, compiled.plan.seed), X, y


def eager_seconds(X, y, steps):
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    X, y = torch.from_numpy(X), torch.from_numpy(y)
    began = time.perf_counter()
    for step in range(steps):
        rows = slice(step * BATCH % ROWS, step * BATCH % ROWS + BATCH)
        optimizer.zero_grad()
        loss = ((model(X[rows]) - y[rows]) ** 2).mean()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - began


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    torch.set_num_threads(1)
    server = LocalServer()
    client = connect(server.url)
    keys = GraphKeys("bench-watch", "g")
    client.hset(keys.meta, mapping={"state": "running", "name": "watched"})
    runner, X, y = fit_loop(args.steps)
    best = {"plain": float("inf"), "watched": float("inf"), "eager": float("inf")}
    try:
        for _ in range(args.rounds):
            began = time.perf_counter()
            runner.run(on_step=lambda *_: None)
            best["plain"] = min(best["plain"], time.perf_counter() - began)
            watch = GraphWatch(client, keys, args.interval)

            def on_step(*_):
                if watch.ended is not None:
                    raise RuntimeError("the graph ended")
            began = time.perf_counter()
            watch.start()
            runner.run(on_step=on_step, stop=watch.stop_requested)
            watch.close()
            best["watched"] = min(best["watched"], time.perf_counter() - began)
            best["eager"] = min(best["eager"], eager_seconds(X, y, args.steps))
    finally:
        client.close()
        server.stop()
    per_step = {k: 1e6 * v / args.steps for k, v in best.items()}
    print(f"{args.steps} steps, best of {args.rounds}, 1 torch thread, watch every {args.interval} s")
    print(f"{'loop':<28}{'us/step':>10}")
    print(f"{'eager PyTorch':<28}{per_step['eager']:>10.1f}")
    print(f"{'LoopRun, nothing watching':<28}{per_step['plain']:>10.1f}")
    print(f"{'LoopRun, graph watched':<28}{per_step['watched']:>10.1f}")
    print(f"overhead of watching: {100 * (per_step['watched'] / per_step['plain'] - 1):+.2f}%")


if __name__ == "__main__":
    main()
