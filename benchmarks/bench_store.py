"""Big tensors through the store (targets: 100 MB written and read back <= 0.3 s; a 1 GiB round trip works,
is exact, and the requester peaks below 3x the tensor).

    python benchmarks/bench_store.py [--mb 100] [--gib 1.0] [--repeats 5]

Rows, all in one run against a private Valkey server on a unix socket (as the embedded default starts):
- memory copy: `tensor.clone()` of the same bytes, the floor;
- raw redis-py: SET then GET of the tensor's bytes as one value, with redis-py's defaults (hiredis);
- store: `ravop.store.tensors` write (chunked, pipelined, zero-copy) then read into one buffer.
Then, in a fresh requester process on the embedded default (1 worker): `R.t(x) * 2 + 1` on a tensor of
--gib GiB, uploaded, run by the worker and fetched; its time, whether it is exact, and the requester's
peak RSS (ru_maxrss: torch itself, x, and everything the round trip added).
"""
import argparse
import json
import subprocess
import sys
import textwrap
import time

import redis
import torch

from ravop.local.embedded import LocalServer
from ravop.store import connect, tensors

ROUND_TRIP = textwrap.dedent("""
    import json, resource, sys, time
    import torch
    import ravop as R

    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    R.initialize(workers=1)
    x = torch.rand(int(float(sys.argv[1]) * 2**30) // 4)
    before = rss()
    start = time.perf_counter()
    (R.t(x) * 2 + 1).persist_op("y")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    y = R.fetch_persisting_op("y")
    seconds = time.perf_counter() - start
    peak = rss()
    step = 2**24  # checked in slices, so the check does not add to the peak it reports
    exact = all(torch.equal(y[i:i + step], x[i:i + step] * 2 + 1) for i in range(0, x.numel(), step))
    print(json.dumps({"seconds": seconds, "exact": exact, "peak": peak, "before": before,
                      "tensor": x.numel() * 4}))
""")


def best(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def store_rows(mb, repeats):
    server = LocalServer()
    try:
        x = torch.rand(mb * 10**6 // 4)
        data = x.numpy().tobytes()
        raw = redis.Redis.from_url(server.url)
        client = connect(server.url)

        def raw_round_trip():
            raw.set("raw", data)
            assert len(raw.get("raw")) == len(data)

        def store_round_trip():
            pipe = client.pipeline(transaction=False)
            tensors.write(pipe, "store", x)
            pipe.execute()
            assert torch.equal(tensors.read(client, "store"), x)

        rows = [("memory copy (tensor.clone)", best(x.clone, repeats)),
                ("raw redis-py SET + GET, one value", best(raw_round_trip, repeats)),
                (f"store write + read ({tensors.chunk_bytes() >> 20} MiB chunks)", best(store_round_trip, repeats))]
        raw.close()
        client.close()
        return rows
    finally:
        server.stop()


def round_trip(gib):
    out = subprocess.run([sys.executable, "-c", ROUND_TRIP, str(gib)], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the round trip failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="size of the store round trip, in MB")
    parser.add_argument("--gib", type=float, default=1.0, help="size of the R.t(x) * 2 + 1 round trip (0: skip)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = store_rows(args.mb, args.repeats)
    print(f"{args.mb} MB, best of {args.repeats}")
    print(f"{'':42} {'seconds':>8} {'x copy':>7}")
    for name, seconds in rows:
        print(f"{name:42} {seconds:8.3f} {seconds / rows[0][1]:7.1f}")
    if args.gib:
        result = round_trip(args.gib)
        tensor = result["tensor"]
        print(f"\nR.t(x) * 2 + 1 on {tensor / 2**30:.2f} GiB, embedded default, 1 worker: {result['seconds']:.1f} s, "
              f"exact: {result['exact']}")
        print(f"requester peak RSS {result['peak'] / 2**30:.2f} GiB = {result['peak'] / tensor:.2f}x the tensor "
              f"(before the round trip, with torch and x: {result['before'] / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
