"""Throughput on one server vs a Redis/Valkey Cluster of 1 and of N shards, in one run (ratios printed).

    python benchmarks/bench_cluster.py [--shards 3] [--requesters 6] [--workers 4] [--seconds 20]
                                       [--tensor-mb 64] [--tensor-clients 6]

Every setup is started here from the server binary the embedded default uses, all over TCP on 127.0.0.1:
a standalone server, a 1-shard cluster and an N-shard cluster (ravop.local.local_cluster).
- graphs/s: `--requesters` processes each upload, start and wait for small graphs (a chain of 3 one-op
  subgraphs) for `--seconds`, while `--workers` worker processes serve them; each requester talks to
  another node.
- GB/s: `--tensor-clients` processes each write a tensor of `--tensor-mb` MB to a graph of its own (4 MiB
  chunks) and read it back, 3 times; bytes written + read over the wall time. A tensor's chunks stay in its
  graph's slot (docs/operators/cluster.md), so several graphs' tensors spread over the shards, not one tensor's chunks.
"""
import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import torch

from ravop.local.embedded import server_binary, start_worker
from ravop.local.local_cluster import LocalCluster, free_ports, wait_until_answers
from ravop.store import Scripts, connect, ensure_queues, graphs
from ravop.store import tensors as stored
from ravop.store.handoff import Handoff
from ravop.store.keys import GraphKeys, worker_key

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_queue_hop import tiny_plan  # noqa: E402

TOKEN = "bench-cluster"


class Standalone:
    """One server over TCP, as the cluster's nodes are (the embedded default's unix socket would be faster)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ravop-bench-")
        [port] = free_ports(1)
        self.urls = [f"redis://127.0.0.1:{port}/0"]
        self.process = subprocess.Popen([server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir",
                                         self.dir, "--save", "", "--appendonly", "yes",
                                         "--maxmemory-policy", "noeviction", "--logfile",
                                         os.path.join(self.dir, "server.log")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_answers(port, self.process, time.monotonic() + 30, self.dir).close()

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def requester(url, token, seconds, ready, results):
    client = connect(url)
    handoff = Handoff(client, Scripts(client))
    ready.wait()
    done, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        plan, constants = tiny_plan(3, True)
        keys = graphs.upload(client, token, plan, constants, {"name": "small"})
        handoff.start(keys)
        client.xread({keys.events: "0-0"}, block=60_000)
        assert client.hget(keys.meta, "state") == b"done"
        client.delete(*[keys.meta, keys.subgraphs, keys.info, keys.deps, keys.done, keys.refs, keys.ran,
                        keys.taken, keys.events, keys.tensor(0), keys.tensor(1), keys.tensor(2), keys.tensor(3)])
        done += 1
    results.put((done, time.time() - seconds, time.time()))


def mover(url, token, megabytes, rounds, ready, results):
    client = connect(url)
    tensor = torch.rand(megabytes * 2**20 // 4)
    keys = GraphKeys(token, uuid.uuid4().hex[:12])
    moved = 0
    ready.wait()
    start = time.time()
    for _ in range(rounds):
        pipe = client.pipeline(transaction=False)
        stored.write(pipe, keys.tensor(0), tensor)
        pipe.execute()
        back = stored.read(client, keys.tensor(0))
        assert back.shape == tensor.shape
        moved += 2 * tensor.numel() * 4
    end = time.time()
    client.delete(*stored.keys_of(keys.tensor(0)))
    results.put((moved, start, end))


def run_all(context, target, urls, args_of, n):
    """(sum of what the `n` processes counted, seconds from the first one's start to the last one's end):
    they start together, once all have connected (their imports are not timed)."""
    results, ready = context.Queue(), context.Barrier(n)
    procs = [context.Process(target=target, args=(urls[i % len(urls)], *args_of(i), ready, results))
             for i in range(n)]
    for proc in procs:
        proc.start()
    replies = [results.get(timeout=900) for _ in procs]
    for proc in procs:
        proc.join()
    return sum(r[0] for r in replies), max(r[2] for r in replies) - min(r[1] for r in replies)


def measure(urls, args):
    context = multiprocessing.get_context("spawn")
    client = connect(urls[0])
    ensure_queues(client)
    names = [f"bench-{uuid.uuid4().hex[:6]}" for _ in range(args.workers)]
    procs = [start_worker(urls[i % len(urls)], name, threads=1) for i, name in enumerate(names)]
    try:
        deadline = time.monotonic() + 120
        while not all(client.exists(worker_key(name)) for name in names):
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        run_all(context, requester, urls, lambda i: (f"{TOKEN}{i}", 2), args.requesters)  # warm up
        count, elapsed = run_all(context, requester, urls, lambda i: (f"{TOKEN}{i}", args.seconds), args.requesters)
        graphs_per_s = count / elapsed
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
    moved, elapsed = run_all(context, mover, urls, lambda i: (f"{TOKEN}{i}", args.tensor_mb, 3), args.tensor_clients)
    client.close()
    return graphs_per_s, moved / elapsed / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--requesters", type=int, default=6)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--tensor-mb", type=int, default=64)
    parser.add_argument("--tensor-clients", type=int, default=6)
    args = parser.parse_args()
    rows = []
    for label, make in (("standalone", Standalone), ("cluster, 1 shard", lambda: LocalCluster(1)),
                        (f"cluster, {args.shards} shards", lambda: LocalCluster(args.shards))):
        setup = make()
        try:
            rows.append((label, *measure(setup.urls, args)))
        finally:
            setup.stop()
        print(f"{label}: {rows[-1][1]:.1f} graphs/s, {rows[-1][2]:.2f} GB/s", flush=True)
    base = rows[0]
    print(f"\n| {'setup':<20} | graphs/s | x standalone | GB/s  | x standalone |")
    print(f"|{'-' * 22}|{'-' * 10}|{'-' * 14}|{'-' * 7}|{'-' * 14}|")
    for label, per_s, gbps in rows:
        print(f"| {label:<20} | {per_s:>8.1f} | {per_s / base[1]:>12.2f} | {gbps:>5.2f} | {gbps / base[2]:>12.2f} |")
    print(f"({args.requesters} requesters, {args.workers} workers, {args.seconds:.0f} s; "
          f"{args.tensor_clients} x {args.tensor_mb} MB tensors, written and read 3 times; {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
