"""A running loop's turn on its worker, looked at beside it with its graph (worker/loops/graph_watch.py's thread,
every WATCH_SECONDS): the worker time it takes is charged to its token as it runs, so that a token past its
--max-worker-seconds has the graph failed naming the quota (the loop then ends at its next step, as after a
cancel); and whether another token's work waits in the work stream with no idle worker to take it. Such work seen
at two looks in a row, once the loop ran its slice here (SLICE_SECONDS times its token's weight), makes the loop
yield at its next step boundary: it checkpoints and is queued again behind that work (consumer's hand-back), and a
worker resumes it from the checkpoint later, with the same bits. A token's small graph so waits about a slice and
a step of another token's loop, not the loop's end."""
import time
from typing import Optional

from ravop.store import GROUP, Scripts, quotas
from ravop.store.client_types import Client
from ravop.store.keys import GraphKeys

from ..serve.token_usage import TokenUsage
from .graph_watch import WATCH_SECONDS, Looker, look_beside

SLICE_SECONDS = 0.5   # the least a loop runs on a claim before it yields to another token's waiting work
PEEK = 32             # undelivered messages looked at for another token's


class Turns:
    """`due`: the loop should yield; set by `look` (from the graph watch's thread)."""

    def __init__(self, client: Client, stream: str, keys: GraphKeys, usage: TokenUsage, weight: float = 1.0) -> None:
        self.client, self.stream, self.keys, self.usage = client, stream, keys, usage
        self.interval = WATCH_SECONDS
        self.slice = SLICE_SECONDS * weight
        self.began = time.monotonic()
        self.seen_waiting = False   # another token's work was waiting at the last look
        self.due = False
        self.looker: Optional[Looker] = None

    def start(self) -> None:
        self.looker = look_beside(self)

    def close(self) -> None:
        if self.looker is not None:
            self.looker.remove(self)

    def look(self) -> None:
        used = self.usage.charge(self.keys.token)
        refusal = quotas.time_refusal(self.keys.token, used, self.usage.quota(self.keys.token))
        if refusal is not None:
            Scripts(self.client).cancel(self.keys, refusal)   # the graph watch ends the loop at its next look
            return
        waiting = self._others_waiting()
        self.due = waiting and self.seen_waiting and time.monotonic() - self.began >= self.slice
        self.seen_waiting = waiting

    def _others_waiting(self) -> bool:
        """Whether a message of another token is in the stream and not delivered to any worker yet."""
        group = next((g for g in self.client.xinfo_groups(self.stream) if g["name"] in (GROUP, GROUP.encode())), None)
        if group is None or group.get("lag") == 0:
            return False
        last = group["last-delivered-id"]
        last = last.decode() if isinstance(last, bytes) else last
        entries = self.client.xrange(self.stream, "(" + last, "+", count=PEEK)
        own = self.keys.token.encode()
        return any(fields.get(b"token") != own for _, fields in entries)
