"""What checking a constant against its requester's seal (ravop/store/seals.py, issue 44) costs where a worker
reads it.

    python benchmarks/bench_constant_seals.py [--repeats 10]

On a private embedded server, per size: reading a stored float32 constant as a worker does (its header and chunks,
decoded: ravop.store.tensors.read) and the round trip with its seal (the MGET alone against the MGET and the HMGET of
the seals in one pipeline), against the SHA-256 the check adds (ravop.store.seals.digest, hashed in place), which is
also what R.activate() adds per constant under a vote. Medians; the check's share of the read.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ravop.local.embedded import LocalServer  # noqa: E402
from ravop.store import GraphKeys, connect  # noqa: E402
from ravop.store import seals, tensors  # noqa: E402


def median_ms(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    server = LocalServer()
    try:
        client = connect(server.url)
        keys = GraphKeys("bench", "constants")
        print(f"medians of {args.repeats}")
        print("| float32 MB | read ms | + seal in its round trip ms | digest ms | check's share of the read |")
        print("|---|---|---|---|---|")
        for mb in (0.004, 1, 16, 256):
            value = torch.rand(max(1, int(mb * 2**20 / 4)))
            key = keys.tensor(1)
            pipe = client.pipeline(transaction=False)
            tensors.write(pipe, key, value, tensors.chunk_bytes())
            seals.record_constants(pipe, keys, {1: value})
            pipe.execute()
            read = median_ms(lambda: tensors.read(client, key), args.repeats)
            alone = median_ms(lambda: client.mget([key]), args.repeats)
            both = median_ms(lambda: client.pipeline(transaction=False).mget([key]).hmget(keys.constants, [1])
                             .execute(), args.repeats)
            stored = tensors.read(client, key)
            hashed = median_ms(lambda: seals.check_constant(1, stored, client.hget(keys.constants, 1)), args.repeats)
            print(f"| {value.nbytes / 2**20:.3f} | {read:.3f} | {both - alone:+.3f} | {hashed:.3f} | "
                  f"{hashed / read:.2f} |")
            client.delete(key, tensors.chunks_key(key))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
