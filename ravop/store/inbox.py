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
dropped or skipped for that token alone: it cannot stop a worker or delay another token."""
import logging
from typing import Dict, List, Set

import redis

from .client_types import Client
from .federated_schema import open_if_federated
from .handoff import Handoff
from .keys import TOKENS, GraphKeys, TokenKeys

log = logging.getLogger("ravop.inbox")
MOVE_SECONDS = 0.01    # the most often a worker looks at the inboxes
FALLBACK_SECONDS = 1.0  # how often it looks without being rung
BATCH = 16          # graphs started per inbox per look


class Inboxes:
    """A worker's side: start the graphs that token users posted."""

    def __init__(self, client: Client, handoff: Handoff) -> None:
        self.client, self.handoff = client, handoff
        self.unreadable: Set[str] = set()  # tokens whose inbox was of another type at the last look

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
        posted: Dict[str, List[bytes]] = {}
        for token, reply in zip(tokens, pipe.execute(raise_on_error=False)):
            if isinstance(reply, redis.ResponseError):  # the user made its inbox another type: its loss
                if token not in self.unreadable:   # said once, not every second
                    log.warning("inbox of token %s unreadable (%s); skipped", token, reply)
                    self.unreadable.add(token)
                continue
            self.unreadable.discard(token)
            posted[token] = reply
        return sum(self._start(token, graph_id) for token, ids in posted.items() for graph_id in ids)

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
