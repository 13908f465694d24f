"""Taking over work from workers that are gone.

Every worker renews a liveness key (TTL `dead_after` seconds) from its heartbeat thread, and with it the idle
time of the message it is running. So a message whose consumer's key has expired, and that has been idle for
`dead_after`, belongs to a dead worker: it is taken over (XCLAIM, which counts a delivery) within a few seconds
of the death. A slow worker is never robbed: its heartbeat runs while its kernels do, keeping both its key and
its message's idle time fresh. A worker restarted under the same name takes what its name held at once
(`predecessor`). As a fallback, a message idle for `stale_after` is taken over whoever holds it (a worker that lost
the server mid-subgraph and went on with other work).

Several idle workers may race for one message; XCLAIM's minimum idle time lets only the first one have it.

On a cluster the same look also delivers what requesters that died while starting a graph left in its outbox
(ravop.store.handoff).
"""
import time
from typing import Any, Dict, Iterator, Optional, Tuple

from ravop.store import GROUP
from ravop.store import workers as liveness
from ravop.store.client_types import Client
from ravop.store.handoff import Handoff

# (message id, fields, deliveries) of a message taken over
Taken = Tuple[bytes, Dict[bytes, bytes], int]


class Takeover:
    def __init__(self, client: Client, stream: str, name: str, dead_after: float, stale_after: float,
                 handoff: Handoff) -> None:
        self.client, self.stream, self.name, self.handoff = client, stream, name, handoff
        self.dead_after_ms = int(dead_after * 1000)
        self.stale_after_ms = int(stale_after * 1000)
        self.every = min(dead_after, stale_after) / 3
        self._due = 0.0

    def next(self) -> Optional[Taken]:
        """(message id, fields, deliveries) of a message to take over, or None. Looks at most every
        `every` seconds, unless the last look found one (more may be waiting)."""
        now = time.monotonic()
        if now < self._due:
            return None
        self._due = now + self.every
        self.handoff.reclaim_starts()
        found = self._from_dead_workers() or self._stale()
        if found is not None:
            self._due = now
        return found

    def look_now(self) -> None:
        """Make the next `next()` look, however recent the last look (a worker that just gave its loop up for a
        dead worker's must find that one first)."""
        self._due = 0.0

    def own(self) -> Optional[Taken]:
        """A message this worker holds itself (it lost the server while running it), or None. Resumed as the
        same delivery (a JUSTID claim counts none): a worker retrying through a long outage must not push the
        message past max_attempts."""
        entries = self.client.xpending_range(self.stream, GROUP, "-", "+", 1, consumername=self.name)
        if not entries:
            return None
        message_id = entries[0]["message_id"]
        self.client.xclaim(self.stream, GROUP, self.name, 0, [message_id], justid=True)   # idle time reset
        found = self.client.xrange(self.stream, message_id, message_id)
        return (message_id, found[0][1], entries[0]["times_delivered"]) if found else None

    def predecessor(self) -> Optional[Taken]:
        """(message id, fields, deliveries) of a message held under this worker's name by a process that died (a
        worker restarted under the same name, as systemd does), taken over at once, or None. Called before this
        process has taken anything, so whatever its name holds is a predecessor's: each process is an incarnation
        of its own, and its first heartbeat must not make the dead one's message look alive until `stale_after`.
        The claim counts a delivery (worker/serve/attempts.py) and needs the idle time XPENDING showed: if another
        worker took the message over in between, its claim reset that time and this one is refused."""
        entries = self.client.xpending_range(self.stream, GROUP, "-", "+", 1, consumername=self.name)
        return self._claim(entries[0], entries[0]["time_since_delivered"]) if entries else None

    def claimable(self) -> list[bytes]:
        """Ids of the messages dead workers hold that this worker could take over (without taking any)."""
        return [entry["message_id"] for entry in self._dead_workers_entries()]

    def _dead_workers_entries(self) -> Iterator[dict[str, Any]]:
        holders = [c["name"].decode() for c in self.client.xpending(self.stream, GROUP)["consumers"]]
        for name in liveness.silent(self.client, [n for n in holders if n != self.name]):
            entries = self.client.xpending_range(self.stream, GROUP, "-", "+", 1, consumername=name,
                                                 idle=self.dead_after_ms)
            if entries:
                yield entries[0]

    def _from_dead_workers(self) -> Optional[Taken]:
        for entry in self._dead_workers_entries():
            found = self._claim(entry, self.dead_after_ms)
            if found is not None:
                return found
        return None

    def _stale(self) -> Optional[Taken]:
        entries = self.client.xpending_range(self.stream, GROUP, "-", "+", 1, idle=self.stale_after_ms)
        return self._claim(entries[0], self.stale_after_ms) if entries else None

    def _claim(self, entry: dict[str, Any], min_idle_ms: int) -> Optional[Taken]:
        claimed = self.client.xclaim(self.stream, GROUP, self.name, min_idle_ms, [entry["message_id"]])
        if not claimed or claimed[0][1] is None:  # another worker was first, or the entry was deleted
            return None
        message_id, fields = claimed[0]
        return message_id, fields, entry["times_delivered"] + 1
