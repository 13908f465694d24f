"""A training loop's worker SIGKILLed mid-fit: another worker resumes from the last checkpoint. Total time
against the undisturbed fit, and the losses and prediction compared bit for bit (issue 9: < 2x).

    python benchmarks/bench_loop_failover.py [--rows 20000] [--epochs 6] [--repeats 2] [--dead-after 3]
                                             [--checkpoint-seconds 10] [--checkpoint-steps 1000]

A private Valkey server and two workers (one thread each). Each repeat fits the MNIST-sized MLP of
bench_ravdl.py (on `--rows` rows) once undisturbed, then again SIGKILLing the worker running the loop half
way through the undisturbed time (a fresh worker replaces it afterwards). The checkpoint settings are the
workers' (defaults: the worker's, 1000 steps or 10 s); the survivor notices the death after `--dead-after`.
"""
import argparse
import os
import signal
import tempfile
import time
import uuid

import torch

import ravop as R
from bench_ravdl import GRAPH_SEED, mnist_data, mnist_weights, record_mnist
from ravop.local.embedded import LocalServer, start_worker
from ravop.record.graph import current_graph
from ravop.store import GraphKeys, connect
from ravop.store.keys import worker_key

TOKEN = "bench-loop-failover"

class Pool:
    def __init__(self, url, args, log_dir):
        self.url, self.log_dir, self.client = url, log_dir, connect(url)
        self.args = ["--dead-after", str(args.dead_after), "--checkpoint-seconds", str(args.checkpoint_seconds),
                     "--checkpoint-steps", str(args.checkpoint_steps)]
        self.procs = {}

    def start(self):
        name = f"bench-{uuid.uuid4().hex[:6]}"
        self.procs[name] = start_worker(self.url, name, "cpu", threads=1,
                                        log_path=os.path.join(self.log_dir, f"{name}.log"), extra_args=self.args)
        while not self.client.exists(worker_key(name)):
            time.sleep(0.05)

    def kill(self, name):
        self.procs.pop(name).send_signal(signal.SIGKILL)

    def stop(self):
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            proc.wait()


def fit(data, epochs, pool=None, kill_after=None):
    """(seconds from R.execute to the last loss fetched, {name: tensor}); with `pool`, SIGKILL the loop's
    worker `kill_after` seconds into the run."""
    X, y, weights = data
    R.flush()
    graph = R.Graph(name="failover fit", seed=GRAPH_SEED)
    model = record_mnist(epochs, X, y, weights)
    model.predict(X[:1000]).persist_op("prediction")
    names = list(current_graph().step_outputs) + ["prediction"]
    R.activate()
    keys = GraphKeys(TOKEN, graph.id)
    start = time.perf_counter()
    R.execute()
    if pool is not None:
        time.sleep(kill_after)
        loop_id = next(int(s) for s in pool.client.hkeys(keys.taken)
                       if pool.client.hget(keys.taken, s).decode() in pool.procs and
                       not pool.client.sismember(keys.done, s))
        pool.kill(pool.client.hget(keys.taken, loop_id).decode())
    R.track_progress(progress_bar=False)
    values = {name: R.fetch_persisting_op(name) for name in names}
    return time.perf_counter() - start, values


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dead-after", type=float, default=3.0)
    parser.add_argument("--checkpoint-seconds", type=float, default=10.0)
    parser.add_argument("--checkpoint-steps", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    X, y = mnist_data(args.rows)
    data = (X, y, mnist_weights())
    server = LocalServer()
    pool = Pool(server.url, args, tempfile.mkdtemp(prefix="bench-loop-failover-"))
    rows = []
    try:
        R.initialize(token=TOKEN, redis_url=server.url)
        pool.start()
        pool.start()
        for _ in range(args.repeats):
            baseline, want = fit(data, args.epochs)
            killed, got = fit(data, args.epochs, pool, kill_after=baseline / 2)
            pool.start()
            same = all(torch.equal(got[name], value) for name, value in want.items())
            rows.append((baseline, killed, same, len(want)))
    finally:
        pool.stop()
        server.stop()
    steps = args.epochs * -(-args.rows // 128)
    print(f"loop failover: MNIST-sized MLP, {args.rows} rows, {args.epochs} epochs ({steps} steps), 2 workers, "
          f"--dead-after {args.dead_after:g}, checkpoints every {args.checkpoint_steps} steps or "
          f"{args.checkpoint_seconds:g} s, the loop's worker SIGKILLed half way")
    print(f"{'undisturbed s':>14}{'with a kill s':>15}{'ratio':>7}  same bits")
    for baseline, killed, same, n in rows:
        print(f"{baseline:>14.2f}{killed:>15.2f}{killed / baseline:>7.2f}  {same} ({n} values)")
    best = min(rows, key=lambda row: row[1] / row[0])
    print(f"best ratio {best[1] / best[0]:.2f}")


if __name__ == "__main__":
    main()
