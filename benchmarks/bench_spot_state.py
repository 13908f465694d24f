"""What a spot check's state derived from the voters' own keys (ravop/store/votes.py, issue 44) costs the SPOT script,
against the script that kept the state in the shared votes hash.

    python benchmarks/bench_spot_state.py --before /work/main [--calls 2000]

`--before`: a checkout whose ravop/store/spot_scripts.py holds the previous SPOT script (a string literal; read as
text, never run as Python). On a private embedded server, both scripts in the same run, each call on a fresh
result: a trusted runner's first vote (drawn unchecked, the common case), an untrusted runner's (drawn checked: the
re-run enqueued), the checker's vote that confirms it, and a deadline check of an open check. Medians per call
(the client's round trip included) and their ratio; a reader's view of a check (votes.read) is bench_votes.py's.
"""
import argparse
import ast
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ravop.core.spot_policy import Verify  # noqa: E402
from ravop.local.embedded import LocalServer  # noqa: E402
from ravop.store import GraphKeys, TokenKeys, connect, queue  # noqa: E402
from ravop.store.keys import principal_key  # noqa: E402
from ravop.store.spot_scripts import SPOT  # noqa: E402


def previous_script(checkout: Path) -> str:
    """The SPOT string literal of `checkout`'s ravop/store/spot_scripts.py."""
    tree = ast.parse((checkout / "ravop/store/spot_scripts.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SPOT" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit(f"no SPOT string literal in {checkout}/ravop/store/spot_scripts.py")


class Variant:
    """One script on its own graph; `call(sid, member, digest)` submits like SpotScript.submit."""

    def __init__(self, client, script: str, graph: str, policy: str, derived: bool) -> None:
        self.client, self.keys, self.derived = client, GraphKeys("bench", graph), derived
        self.script = client.register_script(script)
        client.hset(self.keys.meta, "spot", policy)   # where the previous script reads it
        client.set(self.keys.policy, policy)          # where the derived one does

    def call(self, sid: int, member: str, digest: str) -> list:
        keys = self.keys
        call_keys = [keys.meta, keys.votes(sid), TokenKeys("bench").trust, queue("cpu"), principal_key(member)]
        if self.derived:
            call_keys.append(keys.policy)
        return self.script(keys=call_keys, args=[member, digest, "bench", keys.graph_id, sid, "", "cpu",
                                                  keys.vote(sid)])


def median_us(setup, timed, calls: int) -> float:
    times = []
    for sid in range(calls):
        setup(sid)
        began = time.perf_counter()
        timed(sid)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    server = LocalServer()
    try:
        client = connect(server.url)
        trusted = Verify(rate=0.0, trust_after=0, settle_seconds=3600).encode()
        checked = Verify(rate=1.0, trust_after=0, settle_seconds=3600).encode()
        rows = []
        for what, policy, setup_votes, member, digest in (
                ("trusted runner's vote (unchecked)", trusted, [], "w0", "d" * 64),
                ("untrusted runner's vote (checked: re-run enqueued)", checked, [], "w0", "d" * 64),
                ("checker's vote that confirms it", checked, [("w0", "d" * 64)], "w1", "d" * 64),
                ("deadline check of an open check", checked, [("w0", "d" * 64)], "w1", "")):
            medians = []
            for name, script, derived in (("before", previous_script(args.before), False), ("now", SPOT, True)):
                variant = Variant(client, script, f"{name}-{len(rows)}", policy, derived)

                def setup(sid: int, variant: Variant = variant) -> None:
                    for voter, vote in setup_votes:
                        variant.call(sid, voter, vote)
                medians.append(median_us(setup, lambda sid, v=variant: v.call(sid, member, digest), args.calls))
            rows.append((what, *medians))
            client.delete(queue("cpu"))
        print(f"median of {args.calls} calls, each on a fresh result")
        print("| SPOT call | state in the votes hash us | derived from the voters' keys us | ratio |")
        print("|---|---|---|---|")
        for what, before, now in rows:
            print(f"| {what} | {before:.1f} | {now:.1f} | {now / before:.2f} |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
