"""Queue hop: the round trip of one tiny subgraph through Redis and a worker (target: <= 1 ms).

    python benchmarks/bench_queue_hop.py [--hops 1000] [--redis URL]

Without --redis, a private Valkey server (as the embedded default starts) and one worker process run here.
Rows:
- Redis PING: the floor, one client round trip.
- round trip, empty subgraph: the requester enqueues it (the start script), a worker claims it, checks it,
  completes it (ack, progress, graph done), and the requester, blocked on the graph's events stream,
  wakes up.
- round trip, one op: the same with a node that reads a constant from Redis and writes its output.
- chained hop: a chain of tiny subgraphs, each enqueued by its predecessor's completion; total time per
  subgraph (no requester involved: what a compiled graph pays between its subgraphs).
"""
import argparse
import statistics
import time
import uuid

import torch

from ravop.core.node import Node
from ravop.local.embedded import LocalServer, start_worker
from ravop.store import Scripts, connect, ensure_queues, graphs
from ravop.store.keys import worker_key
from ravop.wire import pack_nodes, plan_pb2

TOKEN = "bench-hop"


def tiny_plan(n_subgraphs, with_op):
    """A chain of `n_subgraphs` subgraphs; with `with_op`, each negates its predecessor's value (the first
    reads constant 0), otherwise each is empty and only waits for its predecessor."""
    plan = plan_pb2.Plan(graph_id=uuid.uuid4().hex[:12])
    for s in range(n_subgraphs):
        sub = plan.subgraphs.add(id=s, device="cpu", n_predecessors=1 if s else 0)
        if s + 1 < n_subgraphs:
            sub.successors.append(s + 1)
        if with_op:
            pack_nodes([Node(s + 1, "neg", [s], shape=[1], dtype=torch.float32)], sub.nodes)
            sub.inputs.append(s)
            sub.outputs.append(s + 1)
    return plan, ({0: torch.ones(1)} if with_op else {})


def round_trips(client, scripts, hops, with_op):
    """Seconds per round trip of single-subgraph graphs, uploaded beforehand."""
    uploaded = []
    for _ in range(hops):
        plan, constants = tiny_plan(1, with_op)
        uploaded.append(graphs.upload(client, TOKEN, plan, constants, {"name": "hop"}))
    times = []
    for keys in uploaded:
        start = time.perf_counter()
        scripts.start(keys)
        client.xread({keys.events: "0-0"}, block=10_000)
        times.append(time.perf_counter() - start)
    return times


def chained(client, scripts, hops, with_op):
    plan, constants = tiny_plan(hops, with_op)
    keys = graphs.upload(client, TOKEN, plan, constants, {"name": "chain"})
    start = time.perf_counter()
    scripts.start(keys)
    client.xread({keys.events: "0-0"}, block=60_000)
    elapsed = time.perf_counter() - start
    assert client.hget(keys.meta, "state") == b"done"
    return elapsed / hops


def pings(client, n):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        client.ping()
        times.append(time.perf_counter() - start)
    return times


def row(label, times):
    ms = sorted(t * 1e3 for t in times)
    p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
    return f"| {label:<38} | {statistics.median(ms):>9.3f} | {p90:>8.3f} | {len(ms):>6} |"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hops", type=int, default=1000)
    parser.add_argument("--redis", default=None, help="a server with at least one CPU worker (default: start both)")
    args = parser.parse_args()
    server = worker = None
    url = args.redis
    if url is None:
        server = LocalServer()
        url = server.url
    client = connect(url)
    ensure_queues(client)
    try:
        if server is not None:
            worker = start_worker(url, "bench-hop", threads=1)
            deadline = time.monotonic() + 120
            while not client.exists(worker_key("bench-hop")):
                assert worker.poll() is None and time.monotonic() < deadline, "the worker did not start"
                time.sleep(0.05)
        scripts = Scripts(client)
        round_trips(client, scripts, 50, True)  # warm up: script loading, first allocations
        rows = [row("Redis PING", pings(client, args.hops)),
                row("round trip, empty subgraph", round_trips(client, scripts, args.hops, False)),
                row("round trip, one op", round_trips(client, scripts, args.hops, True))]
        per_hop = [chained(client, scripts, args.hops, True) for _ in range(5)]
        rows.append(row(f"chained hop ({args.hops} subgraphs, 5 runs)", per_hop))
        print(f"| {'queue hop':<38} | median ms | p90 ms   | n      |")
        print(f"|{'-' * 40}|{'-' * 11}|{'-' * 10}|{'-' * 8}|")
        print("\n".join(rows))
    finally:
        for key in client.scan_iter(match=f"ravop:{TOKEN}:*", count=1000):
            client.unlink(key)
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)
        client.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
