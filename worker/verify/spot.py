"""A worker's side of adaptive spot checks (`R.Graph(verify='spot')`, ravop/core/spot_policy.py): it hands the digest
of each result to the server-side SPOT script (ravop/store/spot_scripts.py) and does what the reply says: store the
result and complete, or ack and go (a check is pending, or this run was a check), or fail the graph when the runs
have no majority. Who is checked, who won a dispute and who is banned are decided by the script alone. Votes are
the worker's principal's (its ACL user), and a check that does not settle in time ends by the deadline check
(`settle`), whose verdict goes to the graph's disputes (`ravop logs`)."""
import logging
from typing import Any, Optional, Union

from ravop.core.node import Node
from ravop.store.keys import GraphKeys
from ravop.store import votes as store_votes
from ravop.store.spot_scripts import SpotScript

log = logging.getLogger("ravop.worker")
ACCEPTED = ("unchecked", "confirmed", "complete", "unverified")
SPLIT = "split"   # the SPOT script's verdict when the runs have no majority (the graph fails)
DISPUTE_LOG_LEN = 1000   # entries kept in a graph's disputes stream


class SpotChecks:
    """Spot checks of the results of `worker` (a worker.serve.consumer.Worker)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.script = SpotScript(worker.client)
        self.member = worker.principal   # who votes: runs of one ACL user count once

    def may_run(self, keys: GraphKeys, subgraph_id: Union[int, str], segment: Optional[str] = None) -> bool:
        """False if this worker already handed in a result of it that is not settled: the re-run must be
        someone else's (the message is passed on)."""
        if self.worker.client.hget(keys.vote(subgraph_id, segment, self.member), "d") is None:
            return True   # not voted: one round trip, as most claims
        check = store_votes.check(self.worker.client, keys, subgraph_id, segment)   # derived from the voters' keys
        return check.state in store_votes.ACCEPTED

    def submit(self, keys: GraphKeys, subgraph_id: Union[int, str], digest: str, segment: Optional[str] = None
               ) -> list[str]:
        """The SPOT script's reply to this worker's digest of a result (counted in its metrics)."""
        reply = self.script.submit(keys, subgraph_id, self.member, digest, self.worker.kind, segment,
                                   self.worker.numerics)
        self.worker.metrics.spot_verdict(reply[0])
        return reply

    def settle(self, keys: GraphKeys, subgraph_id: Union[int, str], segment: Optional[str] = None) -> list[str]:
        """The deadline check of a pending check: 'hold' while it has time, 'again' if it is not pending,
        ['unverified', why] (recorded in the graph's disputes) or ['split', principals...] once it has none."""
        reply = self.script.submit(keys, subgraph_id, self.member, "", self.worker.kind, segment, self.worker.numerics)
        if reply[0] == "unverified":
            what = f"subgraph {subgraph_id}" + ("" if segment is None else f" segment {segment}")
            self.record(keys, subgraph_id, segment, [], None, f"unverified: {what}: {reply[1]}; the runner's result "
                        "is accepted as it is", reason="unverified")
        return reply

    def accepted(self, keys: GraphKeys, subgraph_id: Union[int, str], message_id: Any, digest: str,
                 node: Optional[Node] = None, segment: Optional[str] = None) -> bool:
        """Whether this worker is to store its result and complete (True); otherwise the message was acked, or
        given up on (the runs have no majority: the graph fails naming them)."""
        reply = self.submit(keys, subgraph_id, digest, segment)
        verdict, named = reply[0], reply[1:]
        what = f"subgraph {subgraph_id}" + ("" if segment is None else f" segment {segment}")
        if verdict in ACCEPTED:
            if named:
                self.record(keys, subgraph_id, segment, named, node,
                            f"{what}: {', '.join(named)} differ from {self.member} and the majority; banned "
                            "from this token's work")
            return True
        if verdict == SPLIT:
            self.worker._give_up(keys, message_id, subgraph_id, f"verification failed: {what} gave different "
                                 f"results on different workers: no majority among {', '.join(named)}",
                                 "verification failed", node, worker=",".join(named))
            return False
        self.worker._ack(message_id)
        return False

    def record(self, keys: GraphKeys, subgraph_id: Union[int, str], segment: Optional[str], losers: list[str],
               node: Optional[Node], text: str, reason: str = "verification dispute") -> None:
        """Log a settled dispute in the graph's `disputes` stream, which `ravop logs` shows."""
        log.warning("worker %s: graph %s: %s", self.worker.name, keys.graph_id, text)
        self.worker.client.xadd(keys.disputes, {
            "subgraph": str(subgraph_id), "segment": "" if segment is None else str(segment),
            "worker": ",".join(losers), "reason": reason, "op": getattr(node, "op", "") or "",
            "source": getattr(node, "source", "") or "", "error": text}, maxlen=DISPUTE_LOG_LEN, approximate=True)
