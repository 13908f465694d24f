"""When a loop waiting for another loop's values gives its worker up (worker/loops/loop_subgraph.py: `on_wait`).

A resident replica waiting at a synchronisation does no work, so its worker could run a loop that waits for a
worker: with fewer workers than replicas the replicas must take turns, or the graph deadlocks. But giving a
replica up costs it its place: whoever runs it next reads its data shard and checkpoint again (megabytes over a
slow link), and its worker's cached shard and values are wasted. Asking only "is work queued?" made every
replica waiting at a synchronisation hand its loop back when one provider died (its message became claimable),
and each then took whichever loop was queued: one kill moved every replica.

So the rule matches supply and demand, as a scheduler that keeps tasks where their data is until the cluster
has no free slot (Spark's delay scheduling; Borg preempts only for a task that cannot be placed otherwise):

- demand: the messages waiting for a worker (those no worker has read, and those dead workers hold);
- supply: the live workers of the stream that hold no message (idle: they take a new message at once, a dead
  worker's within `dead_after`);
- only if demand exceeds supply do waiting loops give their workers up, and then only as many as the shortfall:
  those of the busy live workers with the smallest names. One provider lost under N replicas on N providers
  moves one more replica (the smallest-named survivor takes the orphan and takes turns with its own until a
  provider joins), not all of them; replicas far outnumbering workers still take turns on every worker.
- as delay scheduling gives up on locality after a wait, a message that has waited `patience` seconds (seen by
  this worker) while idle workers did not take it (one that may not run it: banned by the graph, or a spot check
  of its own result, passes it on) counts as unmet: at least one worker yields for it.

No deadlock: each of the chosen workers either finishes what it runs (and is idle: supply) or reaches a wait of
its own (and yields), so every queued loop gets a worker. Everything is read from the work stream (its group's
last delivered entry, its pending list) and the liveness keys: no key is added, and workers asking at the same
moment reach the same answer.
"""
import time
from typing import Any, Union

from ravop.store import GROUP
from ravop.store import workers as liveness
from ravop.store.client_types import Client

from ..serve.takeover import Takeover

DEMAND_SCAN = 1000         # unread messages counted at most
PATIENCE_DEAD_AFTERS = 4   # how long, in `dead_after`s, a message may wait with idle workers before one yields


class HandBack:
    """The rule, for worker `name` on `stream`; `now()` asks it (from the loop's wait, twice a second)."""

    def __init__(self, client: Client, stream: str, kind: str, name: str, takeover: Takeover,
                 dead_after: float) -> None:
        self.client, self.stream, self.kind, self.name, self.takeover = client, stream, kind, name, takeover
        self.patience = PATIENCE_DEAD_AFTERS * dead_after
        self._seen: dict[bytes, float] = {}   # id of a waiting message -> when this worker first saw it waiting

    def now(self) -> bool:
        """Whether this worker, waiting in a loop, should hand it back now."""
        waiting = self.waiting()
        at = time.monotonic()
        self._seen = {message_id: self._seen.get(message_id, at) for message_id in waiting}
        if not waiting:
            return False
        live = set(liveness.alive(self.client, self.kind)) | {self.name}
        holders = {_text(c["name"]) for c in self.client.xpending(self.stream, GROUP)["consumers"]}
        busy = live & holders | {self.name}   # this worker holds the loop it waits in
        shortfall = len(waiting) - len(live - busy)
        if min(self._seen.values()) <= at - self.patience:
            shortfall = max(shortfall, 1)     # idle workers let it wait: they cannot take it
        return shortfall > 0 and self.name in sorted(busy)[:shortfall]

    def waiting(self) -> list[bytes]:
        """Ids of the messages waiting for a worker: those of the stream no worker has read yet (at most
        DEMAND_SCAN), and those dead workers hold."""
        group = next((g for g in self.client.xinfo_groups(self.stream) if g["name"] in (GROUP, GROUP.encode())),
                     None)
        last = self.client.xinfo_stream(self.stream)["last-generated-id"]
        unread: list[bytes] = []
        if group is not None and group["last-delivered-id"] != last:
            delivered = group["last-delivered-id"]
            entries = self.client.xrange(self.stream, min=delivered, max="+", count=DEMAND_SCAN + 1)
            unread = [message_id for message_id, _ in entries if message_id != delivered]
        return unread + self.takeover.claimable()


def _text(value: Union[bytes, str, Any]) -> Any:
    return value.decode() if isinstance(value, bytes) else value
