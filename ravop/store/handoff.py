"""From "a subgraph became ready" (a graph's script) to "a worker can claim it" (a message on a work stream).

On a standalone server that is one step: the graph's script puts the message on the stream itself
(ravop.store.scripts). On a cluster a graph's keys and the work streams live in different hash slots, mostly
on different shards, and no script may touch both. So the graph's script, atomic in its slot, pushes what
became ready to the graph's outbox and returns those entries; whoever ran it then delivers them: the XADDs
(and the ack of the message that was completed) in one MULTI in the streams' slot. An entry leaves the outbox
when a worker claims its subgraph (CLAIM, in the graph's slot): a message for it was on a stream, so it was
delivered. A crash between the two steps loses nothing:

- A worker acks the message it completed only in that MULTI. If it dies before, the message stays pending
  and is taken over (worker/serve/takeover.py); the new holder finds the subgraph finished and drains the graph's
  outbox before acking it.
- A requester marks its graph in the shared `starting` set before starting it and clears the mark in the
  MULTI that delivers; workers drain the outboxes of graphs marked more than STALE_START seconds ago (a
  requester that died in between).
- A drain between a delivery and the claim delivers the entry again: a duplicate message, which claim and the
  graph's `done` set make harmless, as for any retry.

A `ravop admin` token user may neither run scripts nor write the work streams (ravop.store.access): its
start is refused with NOPERM, and from then on it names its graphs in its inbox for a worker to start
(`confined`, ravop.store.inbox).
"""
import time
from typing import Iterable, Optional, Set, Tuple

import redis

from .client_types import Client, MessageId
from .keys import GROUP, STARTED, STARTING, GraphKeys, TokenKeys, device_kind, graph_ref, queue
from .scripts import Scripts

STALE_START = 10.0  # seconds after which a graph still marked starting is taken to have lost its requester
RECLAIM_BATCH = 16


def _parse(entry: bytes) -> Optional[Tuple[str, str, int]]:
    """(device kind, subgraph id, copies) of an outbox entry, or None for one no script wrote (a requester may
    write to its graphs' keys): dropped, so that it cannot name another stream or stop a worker that drains it."""
    try:
        device, subgraph_id, copies = entry.decode().split(";")
        parsed = device_kind(device), str(int(subgraph_id)), int(copies)
    except (UnicodeDecodeError, ValueError):
        return None
    return parsed if parsed[2] >= 1 else None


class Handoff:
    def __init__(self, client: Client, scripts: Scripts) -> None:
        self.client, self.scripts = client, scripts
        self.confined = False  # a token user's: its starts go through its inbox
        # graphs this session named in its inbox: one found neither there nor started was dropped (a worker user
        # may ZREM any inbox), and its requester posts it again (ravop.client.tracking)
        self.posted: Set[str] = set()

    def start(self, keys: GraphKeys) -> int:
        """Start the graph (START) and get its first subgraphs onto the work streams; 1 if it started now, 0
        if it had already started; ResponseError NOGRAPH if it is gone. A token user's start names the graph
        in its inbox instead (returns 1; a worker starts it)."""
        if not self.confined:
            try:
                return self._start(keys)
            except redis.exceptions.NoPermissionError:
                self.confined = True
        if not self.client.exists(keys.meta):
            raise redis.ResponseError(f"NOGRAPH graph {keys.graph_id} is not in Redis")
        self.client.zadd(TokenKeys(keys.token).inbox, {keys.graph_id: time.time()})
        self.posted.add(keys.graph_id)
        try:
            self.client.publish(STARTED, keys.token)  # wakes the workers' inbox watchers (worker/serve/inbox_watch.py)
        except redis.exceptions.NoPermissionError:
            pass  # a token user made before the channel was granted: workers look every second anyway
        return 1

    def _start(self, keys: GraphKeys) -> int:
        if self.scripts.direct:
            return self.scripts.start(keys)[0]
        ref = graph_ref(keys)
        self.client.zadd(STARTING, {ref: time.time()})
        started, handed = self.scripts.start(keys)
        self.deliver(keys, handed, unmark=ref)
        return started

    def completed(self, keys: GraphKeys, handed: Iterable[bytes], stream: str, message_id: MessageId) -> None:
        """After COMPLETE: deliver what it handed off and ack the message (a standalone server's script did)."""
        if not self.scripts.direct:
            self.deliver(keys, handed, stream, message_id)

    def deliver(self, keys: GraphKeys, entries: Iterable[bytes], stream: Optional[str] = None,
                message_id: MessageId = "", unmark: Optional[str] = None) -> None:
        """Put outbox `entries` ("device;subgraph id;copies") of the graph on their work streams, ack
        `message_id` of `stream` and clear the starting mark `unmark`, in one transaction."""
        pipe = self.client.pipeline(transaction=True)
        for device, subgraph_id, copies in filter(None, map(_parse, entries)):
            for _ in range(copies):
                pipe.xadd(queue(device), {"token": keys.token, "graph": keys.graph_id, "subgraph": subgraph_id})
        if message_id and stream is not None:
            pipe.xack(stream, GROUP, message_id)
            pipe.xdel(stream, message_id)
        if unmark is not None:
            pipe.zrem(STARTING, unmark)
        if len(pipe):
            pipe.execute()

    def drain(self, keys: GraphKeys, unmark: Optional[str] = None) -> None:
        """Deliver whatever the graph's outbox holds (left by someone who died before delivering it, or not
        claimed yet), dropping entries no script wrote."""
        if self.scripts.direct:
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(keys.outbox)
        pipe.hget(keys.meta, "verify")
        held, copies = pipe.execute()
        entries = [b"%s;%s;%s" % (device, sid, copies or b"1") for sid, device in held.items()]
        forged = [sid for sid, entry in zip(held, entries) if _parse(entry) is None]
        if forged:
            self.client.hdel(keys.outbox, *forged)
        self.deliver(keys, entries, unmark=unmark)

    def reclaim_starts(self, older_than: float = STALE_START) -> int:
        """Drain the outboxes of graphs marked starting more than `older_than` seconds ago; how many."""
        if self.scripts.direct:
            return 0
        stale = self.client.zrangebyscore(STARTING, "-inf", time.time() - older_than, start=0, num=RECLAIM_BATCH)
        for ref in stale:
            try:
                token, graph_id = ref.decode().split("/", 1)
                keys = GraphKeys(token, graph_id)
            except (UnicodeDecodeError, ValueError):  # not a graph reference (a requester may write this set)
                self.client.zrem(STARTING, ref)
                continue
            self.drain(keys, unmark=ref)
        return len(stale)
