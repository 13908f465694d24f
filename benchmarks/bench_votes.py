"""What votes per principal (ravop/store/votes.py, issue 44) cost against the votes hash they replaced.

    python benchmarks/bench_votes.py [--voters 3] [--calls 2000]

On a private embedded server: the VOTE script of R.Graph(verify=k) (each vote in its principal's own key,
read back per voter) against the one before (one HSET and HGETALL of a shared hash), and a reader's view of a
check (ravop.store.votes.read: the voters' hash, then their vote keys in one pipeline) against one HGETALL. Both
on the same server in the same run; medians per call, and their ratio.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ravop.local.embedded import LocalServer  # noqa: E402
from ravop.store import GraphKeys, Scripts, connect, votes  # noqa: E402

# The VOTE script before issue 44's votes per principal (ravop/store/scripts.py at 7b9d44b's parent).
SHARED_HASH_VOTE = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if redis.call('HLEN', KEYS[1]) < tonumber(ARGV[3]) then return {} end
return redis.call('HGETALL', KEYS[1])
"""


def median_us(call, calls: int) -> float:
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--voters", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    server = LocalServer()
    try:
        client = connect(server.url)
        keys = GraphKeys("bench", "votes")
        scripts, old = Scripts(client), client.register_script(SHARED_HASH_VOTE)
        names = [f"w{i}" for i in range(args.voters)]
        for name in names:   # the votes are in: each later call is a voter's retry that reads them all
            scripts.vote(keys, 1, name, "d" * 64, args.voters)
            old(keys=[keys.votes(2)], args=[name, "d" * 64, args.voters])
        rows = [("VOTE script", median_us(lambda: old(keys=[keys.votes(2)], args=["w0", "d" * 64, args.voters]),
                                          args.calls),
                 median_us(lambda: scripts.vote(keys, 1, "w0", "d" * 64, args.voters), args.calls)),
                ("a reader's view of a check", median_us(lambda: client.hgetall(keys.votes(2)), args.calls),
                 median_us(lambda: votes.read(client, keys, 1), args.calls))]
        print(f"{args.voters} voters, median of {args.calls} calls")
        print("| what | shared hash us | per principal us | ratio |\n|---|---|---|---|")
        for what, before, now in rows:
            print(f"| {what} | {before:.1f} | {now:.1f} | {now / before:.2f} |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
