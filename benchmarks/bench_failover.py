"""Failover: what a worker SIGKILLed mid-graph costs the graph.

    python benchmarks/bench_failover.py [--subgraphs 6] [--steps 40] [--repeats 3] [--dead-after 3]
                                        [--reclaim-idle 30]

A private Valkey server and two worker processes (one thread each) run a chain of subgraphs, each a run of
512x512 matmuls. Each repeat runs the graph once undisturbed (the baseline), then again SIGKILLing the worker
that runs the middle subgraph half a second into it (a fresh worker replaces it for the next repeat). The
other worker is idle then (a chain has one runnable subgraph), so the graph waits exactly as long as the
takeover takes. Rows:
- baseline: the undisturbed graph's time;
- with a kill: the graph's time when a worker is killed;
- work lost: seconds the killed worker had spent on its subgraph;
- stall (takeover): seconds from the kill until the surviving worker starts the dead worker's subgraph.
Best (lowest) and worst of the repeats are shown. `--dead-after 1e6` leaves only the idle-time fallback
(--reclaim-idle), as workers reclaimed work before heartbeat-based detection.
"""
import argparse
import os
import signal
import tempfile
import time
import uuid

import torch

from ravop.core.node import Node
from ravop.local.embedded import LocalServer, start_worker
from ravop.store import Scripts, connect, graphs
from ravop.store.keys import worker_key
from ravop.wire import pack_nodes, plan_pb2

TOKEN = "bench-failover"
N = 512


def chain_plan(n_subgraphs, steps):
    """Subgraph s: `steps` times x = tanh(x @ b); x from subgraph s - 1 (constant 0 for the first), b constant 1."""
    plan = plan_pb2.Plan(graph_id=uuid.uuid4().hex[:12])
    next_id = 2 + n_subgraphs * 2 * steps
    value = 0
    for s in range(n_subgraphs):
        sub = plan.subgraphs.add(id=s, device="cpu", n_predecessors=1 if s else 0, inputs=[value, 1])
        if s + 1 < n_subgraphs:
            sub.successors.append(s + 1)
        rows = []
        for _ in range(steps):
            product, next_id = next_id, next_id + 1
            rows.append(Node(product, "matmul", [value, 1], shape=[N, N], dtype=torch.float32))
            value, next_id = next_id, next_id + 1
            rows.append(Node(value, "tanh", [product], shape=[N, N], dtype=torch.float32))
        pack_nodes(rows, sub.nodes)
        sub.outputs.append(value)
    plan.persisted["out"] = value
    generator = torch.Generator().manual_seed(0)
    return plan, {0: torch.rand(N, N, generator=generator), 1: torch.rand(N, N, generator=generator) / N}


class Pool:
    def __init__(self, url, dead_after, reclaim_idle, log_dir):
        self.url, self.log_dir = url, log_dir
        self.args = ["--dead-after", str(dead_after), "--reclaim-idle", str(reclaim_idle)]
        self.client = connect(url)
        self.procs = {}

    def start(self):
        name = f"bench-{uuid.uuid4().hex[:6]}"
        self.procs[name] = start_worker(self.url, name, "cpu", threads=1,
                                        log_path=os.path.join(self.log_dir, f"{name}.log"),
                                        extra_args=self.args)
        while not self.client.exists(worker_key(name)):
            time.sleep(0.05)
        return name

    def kill(self, name):
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()
        del self.procs[name]

    def stop(self):
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            proc.wait()


def run_graph(client, scripts, n_subgraphs, steps, pool=None):
    """Seconds the graph took; with `pool`, kill the worker of the middle subgraph 0.5 s into it and also
    return (seconds from kill to takeover, seconds of work lost)."""
    plan, constants = chain_plan(n_subgraphs, steps)
    keys = graphs.upload(client, TOKEN, plan, constants, {"name": "failover"})
    start = time.perf_counter()
    scripts.start(keys)
    takeover = lost = None
    if pool is not None:
        middle = n_subgraphs // 2
        while (victim := client.hget(keys.taken, middle)) is None:
            time.sleep(0.002)
        taken_at = time.perf_counter()
        time.sleep(0.5)
        pool.kill(victim.decode())
        killed = time.perf_counter()
        lost = killed - taken_at
        while client.hget(keys.taken, middle) == victim:
            time.sleep(0.002)
        takeover = time.perf_counter() - killed
    client.xread({keys.events: "0-0"}, block=600_000)
    elapsed = time.perf_counter() - start
    assert client.hget(keys.meta, "state") == b"done", client.hget(keys.meta, "error")
    return elapsed, takeover, lost


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subgraphs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40, help="matmul+tanh steps per subgraph")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dead-after", type=float, default=3.0, help="the workers' --dead-after (seconds)")
    parser.add_argument("--reclaim-idle", type=float, default=30.0, help="the workers' --reclaim-idle (seconds)")
    args = parser.parse_args()
    server = LocalServer()
    log_dir = tempfile.mkdtemp(prefix="bench-failover-")
    pool = Pool(server.url, args.dead_after, args.reclaim_idle, log_dir)
    rows = {"baseline": [], "with a kill": [], "work lost": [], "stall (takeover)": []}
    try:
        client = pool.client
        scripts = Scripts(client)
        pool.start()
        pool.start()
        for _ in range(args.repeats):
            baseline, _, _ = run_graph(client, scripts, args.subgraphs, args.steps)
            killed, takeover, lost = run_graph(client, scripts, args.subgraphs, args.steps, pool)
            pool.start()
            rows["baseline"].append(baseline)
            rows["with a kill"].append(killed)
            rows["work lost"].append(lost)
            rows["stall (takeover)"].append(takeover)
    finally:
        pool.stop()
        server.stop()
    print(f"failover: {args.subgraphs} subgraphs x {args.steps} steps, 2 workers, --dead-after "
          f"{args.dead_after:g} --reclaim-idle {args.reclaim_idle:g}, {args.repeats} repeats")
    print(f"{'':<18}{'best s':>10}{'worst s':>10}")
    for name, values in rows.items():
        print(f"{name:<18}{min(values):>10.2f}{max(values):>10.2f}")


if __name__ == "__main__":
    main()
