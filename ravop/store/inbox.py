"""Starting the graphs of `ravop admin` token users: a token user may not write the work streams (a raw
XADD ... MAXLEN 0, XTRIM or DEL there would lose every token's queued work), so it names the graph it starts
in its own inbox (ravop.store.keys: `ravop:{token}:inbox`), and workers, who may write the streams, start it
with the same START script a requester on the default user runs itself (ravop.store.handoff, which
posts to the inbox when the token user's script is refused).

Workers learn the token users from the token registry that only `ravop admin` writes (`ravop:_:tokens`), and
look at every inbox when a token user rings the STARTED channel, and every FALLBACK_SECONDS anyway (a ring
may be missed), at most every MOVE_SECONDS (a token user ringing it without end costs each worker that many
looks a second, one round trip each; worker/serve/inbox_watch.py). Whatever a token user puts in its own inbox (a string
key, a graph id of another token: its inbox only names its own token's graphs, a graph id that does not exist) is
dropped or skipped for that token alone: it cannot stop a worker or delay another token.

Fair share: a token's graphs are started only while fewer than ADMIT times its weight of its subgraphs wait
undelivered in the work streams, tokens taken in the order of their worker time used per weight
(ravop.store.quotas): the inboxes are the tokens' own queues, and the work streams stay short, so a token's small
graph posted after another token's backlog is started and taken behind a few of that token's messages, not behind
all of them. What is held back stays in its inbox and is looked at again within HELD_SECONDS."""
import logging
import math
from collections import Counter
from typing import Dict, List, Set

import redis

from .client_types import Client
from .federated_schema import open_if_federated
from .handoff import Handoff
from . import quotas
from .keys import DEVICE_KINDS, GROUP, TOKENS, GraphKeys, TokenKeys, queue, quota_key, usage_key

log = logging.getLogger("ravop.inbox")
MOVE_SECONDS = 0.01    # the most often a worker looks at the inboxes
FALLBACK_SECONDS = 1.0  # how often it looks without being rung
BATCH = 16          # graphs started per inbox per look
ADMIT = 4           # a token's subgraphs waiting undelivered (times its weight) before its next graph waits too
HELD_SECONDS = 0.02  # how soon held-back graphs are looked at again
PEEK = 256          # undelivered messages counted per work stream


class Inboxes:
    """A worker's side: start the graphs that token users posted."""

    def __init__(self, client: Client, handoff: Handoff) -> None:
        self.client, self.handoff = client, handoff
        self.unreadable: Set[str] = set()  # tokens whose inbox was of another type at the last look
        self.held_back = False   # graphs were left in their inboxes at the last look for fairness

    def move(self) -> int:
        """Start what the inboxes hold; how many graphs were started now."""
        try:
            tokens = sorted(t.decode() for t in self.client.smembers(TOKENS))
        except redis.ResponseError as exc:  # a worker user made before token registries, or a damaged key
            log.warning("token registry unreadable (%s); token users' graphs are not started", exc)
            return 0
        if not tokens:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for token in tokens:
            pipe.zrange(TokenKeys(token).inbox, 0, BATCH - 1)
            pipe.hgetall(quota_key(token))
            pipe.hgetall(usage_key(token))
        replies = pipe.execute(raise_on_error=False)
        posted: Dict[str, List[bytes]] = {}
        weights: Dict[str, float] = {}
        used: Dict[str, float] = {}
        stale_held: List[str] = []
        for i, token in enumerate(tokens):
            reply, quota, usage = replies[3 * i: 3 * i + 3]
            weights[token] = quotas.decode(quota).weight if isinstance(quota, dict) else 1.0
            used[token] = quotas.worker_seconds(usage) if isinstance(usage, dict) else 0.0
            if isinstance(usage, dict) and usage.get(quotas.HELD.encode(), b"0") != b"0":
                stale_held.append(token)   # said at an earlier look: reset below unless it still holds some
            if isinstance(reply, redis.ResponseError):  # the user made its inbox another type: its loss
                if token not in self.unreadable:   # said once, not every second
                    log.warning("inbox of token %s unreadable (%s); skipped", token, reply)
                    self.unreadable.add(token)
                continue
            self.unreadable.discard(token)
            if reply:
                posted[token] = reply
        self.held_back = False
        if posted:
            posted = self._fair(posted, weights, used)
        stale_held = [token for token in stale_held if token not in posted]
        if stale_held:   # their inboxes are empty now: their requesters wait for their next graphs' starts again
            pipe = self.client.pipeline(transaction=False)
            for token in stale_held:
                pipe.hset(usage_key(token), quotas.HELD, 0)
            pipe.execute()
        return sum(self._start(token, graph_id) for token, ids in posted.items() for graph_id in ids)

    def _fair(self, posted: Dict[str, List[bytes]], weights: Dict[str, float],
              used: Dict[str, float]) -> Dict[str, List[bytes]]:
        """What to start of `posted` now, tokens in the order of worker time used per weight, each up to ADMIT times
        its weight of its subgraphs waiting undelivered in the work streams."""
        waiting = self._waiting()
        chosen: Dict[str, List[bytes]] = {}
        pipe = self.client.pipeline(transaction=False)
        for token in sorted(posted, key=lambda t: used[t] / weights[t]):
            room = max(0, math.ceil(ADMIT * weights[token]) - waiting[token])
            chosen[token] = posted[token][:room]
            held = len(posted[token]) - len(chosen[token])
            self.held_back = self.held_back or held > 0
            pipe.hset(usage_key(token), quotas.HELD, held)   # its requester waits no longer for the start
        pipe.execute()
        return chosen

    def _waiting(self) -> Counter:
        """token -> its messages in the work streams not delivered to a worker yet (the first PEEK of each)."""
        found: Counter = Counter()
        for kind in DEVICE_KINDS:
            stream = queue(kind)
            try:
                groups = self.client.xinfo_groups(stream)
            except redis.ResponseError:   # no such stream yet
                continue
            group = next((g for g in groups if g["name"] in (GROUP, GROUP.encode())), None)
            if group is None or group.get("lag") == 0:
                continue
            last = group["last-delivered-id"]
            last = last.decode() if isinstance(last, bytes) else last
            for _, fields in self.client.xrange(stream, "(" + last, "+", count=PEEK):
                found[fields.get(b"token", b"").decode(errors="replace")] += 1
        return found

    def _start(self, token: str, raw_id: bytes) -> int:
        inbox = TokenKeys(token).inbox
        try:
            keys = GraphKeys(token, raw_id.decode())
            started = self.handoff.start(keys)
            open_if_federated(self.client, keys)
        except (UnicodeDecodeError, ValueError) as exc:   # not a graph id: no script wrote it
            log.warning("inbox of token %s: dropped %r (%s)", token, raw_id[:80], exc)
            started = 0
        except redis.ResponseError as exc:   # NOGRAPH (flushed meanwhile), or a key of the wrong type
            log.warning("inbox of token %s: graph %r not started (%s)", token, raw_id[:80], exc)
            started = 0
        self.client.zrem(inbox, raw_id)
        return int(started)
