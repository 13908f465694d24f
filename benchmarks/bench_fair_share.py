"""Fair share between tokens (issue 44): token B's small graph (x @ x of 128 x 128, one subgraph) on a quiet server,
then while token A keeps both workers busy with endless loops and a backlog of queued graphs; and how long a cancel
and a revocation take to stop A's running loops (from the call returning to the workers holding no message). All
with `ravop admin` token users and worker-user processes on an embedded server, in one run.

    python benchmarks/bench_fair_share.py [--trials 3] [--steps 10000000] [--backlog 100] [--workers 2]

Target: B's wait under load <= 2x its quiet time + 3 s; a cancel or revocation felt within about a second.
`--steps`: the loops' length (10^7 runs minutes here; recording 10^9 takes minutes today: issue 44's fit bullet).
"""
import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import ravop as R  # noqa: E402
from ravop.client.session import require  # noqa: E402
from ravop.local.embedded import LocalServer  # noqa: E402
from ravop.store import GROUP, queue  # noqa: E402
from ravop.store import graphs as store_graphs  # noqa: E402
from ravop.tools import admin, status  # noqa: E402
from conftest import Workers  # noqa: E402
from test_fair_share import endless_loop as endless  # noqa: E402


def token(client, url):
    name = f"t{uuid.uuid4().hex[:8]}"
    return name, admin.create(client, url, "token", name)[0]


def small(name):
    R.Graph(name=name)
    x = R.t(torch.full((128, 128), 2.0))
    (x @ x).persist_op("out")
    R.activate()
    R.execute()
    return require().keys()


def b_graph(url_b, trial):
    """Seconds from B's R.execute() to its graph done (recording and activation before the clock)."""
    R.initialize(redis_url=url_b)
    R.Graph(name=f"b-{trial}")
    x = R.t(torch.full((128, 128), 3.0))
    (x @ x).persist_op("out")
    R.activate()
    began = time.monotonic()
    R.execute()
    R.track_progress(progress_bar=False, timeout=900)
    return time.monotonic() - began


def wait(condition, timeout=600):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("gave up waiting")
        time.sleep(0.005)


def held(client, keys):
    """Whether a worker holds a message of the graph at `keys` (runs its loop)."""
    stream = queue("cpu")
    for entry in client.xpending_range(stream, GROUP, "-", "+", 100):
        found = client.xrange(stream, entry["message_id"], entry["message_id"])
        if found and found[0][1].get(b"graph") == keys.graph_id.encode():
            return True
    return False


def felt(client, keys, act):
    """Seconds from `act()` returning to no worker holding a message of the graph at `keys`."""
    act()
    began = time.monotonic()
    wait(lambda: not held(client, keys))
    return time.monotonic() - began


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10_000_000)
    parser.add_argument("--backlog", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    server = LocalServer()
    client = redis.Redis.from_url(server.url)
    worker_url, _ = admin.create(client, server.url, "worker", "bench-fair")
    pool = Workers(worker_url, Path(tempfile.mkdtemp()))
    try:
        pool.start(args.workers)
        _, url_b = token(client, server.url)
        b_graph(url_b, "warm")
        quiet = [b_graph(url_b, f"quiet-{t}") for t in range(args.trials)]
        name_a, url_a = token(client, server.url)
        R.initialize(redis_url=url_a)
        loops = [endless(f"a-loop-{i}", args.steps) for i in range(args.workers)]
        wait(lambda: all(store_graphs.steps_done(client, k) > 0 for k in loops))
        loaded = []
        for t in range(args.trials):
            R.initialize(redis_url=url_a)
            for i in range(args.backlog):
                small(f"a-small-{t}-{i}")
            loaded.append(b_graph(url_b, f"loaded-{t}"))
        cancels = []
        for keys in loops:   # each while it runs (resumed after B's turn), unless it ended meanwhile
            wait(lambda: held(client, keys) or store_graphs.read_state(client, keys)["state"] != "running")
            if held(client, keys):
                cancels.append(felt(client, keys, lambda: status.cancel(client, keys)))
        R.initialize(redis_url=url_a)
        last = endless("a-revoked", args.steps)
        wait(lambda: store_graphs.steps_done(client, last) > 0)
        revoked = felt(client, last, lambda: admin.revoke(client, "token", name_a))
    finally:
        pool.stop_all()
        server.stop()
    q, lo = statistics.median(quiet), statistics.median(loaded)
    target = 2 * q + 3
    print(f"B's small graph, quiet: median {q:.3f} s ({', '.join(f'{v:.3f}' for v in quiet)})")
    print(f"B's small graph beside A's {args.workers} loops and {args.backlog} queued graphs: median {lo:.3f} s "
          f"({', '.join(f'{v:.3f}' for v in loaded)}), max {max(loaded):.3f} s; {lo / q:.1f}x quiet; target "
          f"2x quiet + 3 s = {target:.2f} s: {'met' if max(loaded) <= target else 'NOT met'}")
    print(f"cancel felt by a running loop after {', '.join(f'{v:.3f}' for v in cancels) or '- (the loops ended)'} s; "
          f"revocation after {revoked:.3f} s")


if __name__ == "__main__":
    main()
