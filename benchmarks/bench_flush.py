"""R.flush on a store that other tokens fill: by the names the token's records give (ravop.store.flush) against
the SCAN of the whole keyspace it falls back to, on a private server holding `--others` keys of another token
(the embedded default's persistent store had collected 46,000), one activated digits CNN fit to delete each time.

    python benchmarks/bench_flush.py [--others 46000] [--repeats 20]
"""
import argparse
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ravop as R  # noqa: E402
import bench_contention  # noqa: E402
from busy import load  # noqa: E402
from example_data import digits_data  # noqa: E402
from ravop.local.embedded import LocalServer  # noqa: E402
from ravop.store import GraphKeys  # noqa: E402
from ravop.store import flush as flush_module  # noqa: E402


def flush_seconds(X, y, by_scan):
    """Seconds of one R.flush of an activated digits CNN fit (a SCAN if `by_scan`)."""
    R.Graph(name="flush bench", seed=0)
    with contextlib.redirect_stdout(io.StringIO()):
        bench_contention.record_cnn(1, 32, X, y)
    R.activate()
    named = flush_module.owned_keys
    if by_scan:
        flush_module.owned_keys = lambda client, token: None
    try:
        start = time.perf_counter()
        R.flush()
        return time.perf_counter() - start
    finally:
        flush_module.owned_keys = named


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--others", type=int, default=46_000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    X, _, y, _ = digits_data()
    server = LocalServer()
    try:
        session = R.initialize(token="bench-flush", redis_url=server.url)
        pipe = session.client.pipeline(transaction=False)
        for k in range(args.others):
            pipe.set(GraphKeys("someone-else", f"g{k // 100}").tensor(k), b"x")
        pipe.execute()
        print(f"{args.others:,} keys of another token; {load()}; ms per flush, best / median of {args.repeats}")
        for label, by_scan in (("by name", False), ("by SCAN", True)):
            times = [flush_seconds(X, y, by_scan) for _ in range(args.repeats)]
            print(f"{label:<8} {min(times) * 1e3:7.2f} {statistics.median(times) * 1e3:7.2f}", flush=True)
        left = [k for k in session.client.keys("*") if b"someone-else" not in k]
        assert session.client.dbsize() - len(left) == args.others, left[:5]   # nothing of another token went
        print(load())
    finally:
        server.stop()


if __name__ == "__main__":
    main()
