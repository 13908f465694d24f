"""How long a loop running on a real worker takes to feel a cancel: from `ravop.tools.status.cancel` returning to the
worker acking the loop's message (it left the loop), for a loop whose steps persist a 256 KB value each, so that
its flushes are slow and spaced far apart (worker/loops/loop_subgraph.py spaces them to a 20th of the loop's time):
before worker/loops/graph_watch.py the loop learned of a cancel only at a flush.

    python benchmarks/bench_cancel_delay.py [--trials 3] [--steps 3000]
"""
import argparse
import os
import tempfile
import time
import uuid

import torch

import ravop as R
from ravop.client.session import require
from ravop.local.embedded import LocalServer, start_worker
from ravop.record.loop import Loop
from ravop.store import GROUP, connect, queue
from ravop.store import graphs as store_graphs
from ravop.store.keys import worker_key
from ravop.tools import status


def record(trial, steps):
    R.Graph(name=f"persisting-{trial}", seed=7)
    loop = Loop([R.t(torch.zeros(65536))])
    m = R.t(torch.eye(256) * 0.5)
    with loop.step() as step:
        (w,) = step.carried
        x = w.reshape((256, 256))
        for _ in range(6):
            x = x @ m + 1
        after = w + x.reshape((65536,)) * 0
        step.persist(after, [f"w_{k}" for k in range(steps)])
        step.carry([after])
    [final] = loop.run([(0, steps)])
    final.persist_op("final")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args()
    server = LocalServer()
    client = connect(server.url)
    name = f"w-{uuid.uuid4().hex[:6]}"
    worker = start_worker(server.url, name, "cpu", threads=1, log_path=os.path.join(tempfile.mkdtemp(), "w.log"))
    try:
        while not client.exists(worker_key(name)):
            time.sleep(0.05)
        R.initialize(token="bench-cancel", redis_url=server.url)
        delays = []
        for trial in range(args.trials):
            record(trial, args.steps)
            R.activate()
            R.execute()
            keys = require().keys()
            while store_graphs.steps_done(client, keys) < 8:
                time.sleep(0.01)
            time.sleep(3.0)
            status.cancel(client, keys)
            cancelled = time.monotonic()
            while client.xpending(queue("cpu"), GROUP)["pending"]:
                time.sleep(0.005)
            delays.append(time.monotonic() - cancelled)
            print(f"trial {trial + 1}: cancel felt after {delays[-1]:.3f} s", flush=True)
            R.flush()
        print(f"cancel delay: median {sorted(delays)[len(delays) // 2]:.3f} s, max {max(delays):.3f} s")
    finally:
        worker.terminate()
        worker.wait()
        client.close()
        server.stop()


if __name__ == "__main__":
    main()
