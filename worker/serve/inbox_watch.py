"""A worker's thread that starts the graphs token users post to their inboxes (ravop.store.inbox): woken by
the STARTED channel, and every FALLBACK_SECONDS anyway. It runs beside the worker loop, which blocks on the
work stream and is woken by the subgraphs this thread hands off there. It never ends on a server error: it
logs, waits and goes on, until the worker stops."""
import logging
import threading
from typing import Any, Optional

import redis

from ravop.store.client_types import Client
from ravop.store.handoff import Handoff
from ravop.store.inbox import FALLBACK_SECONDS, HELD_SECONDS, MOVE_SECONDS, Inboxes
from ravop.store.keys import STARTED

log = logging.getLogger("ravop.worker")


class InboxWatch(threading.Thread):
    def __init__(self, client: Client, handoff: Handoff, name: str, stopping: threading.Event) -> None:
        super().__init__(name=f"inboxes-{name}", daemon=True)
        self.client, self.inboxes, self.stopping = client, Inboxes(client, handoff), stopping
        self._end = threading.Event()

    def run(self) -> None:
        pubsub: Optional[Any] = None   # redis.client.PubSub, opened on the first look and again after an error
        while not (self._end.is_set() or self.stopping.is_set()):
            try:
                if pubsub is None:
                    pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(STARTED)
                # graphs held back for fairness are looked at again soon: their token's queued work drains fast
                pubsub.get_message(timeout=HELD_SECONDS if self.inboxes.held_back else FALLBACK_SECONDS)
                while pubsub.get_message(timeout=0) is not None:   # one look for every ring so far
                    pass
                self.inboxes.move()
                self._end.wait(MOVE_SECONDS)   # rings meanwhile wait in the subscription: one look for them
            except redis.RedisError as exc:   # a lost server (the worker loop reports it), a refused subscribe
                log.debug("inbox watch: %s", exc)
                pubsub = self._close(pubsub)
                self._end.wait(FALLBACK_SECONDS)
            except Exception:  # noqa: BLE001 - a bug must not silently stop token users' starts: log, go on
                log.exception("inbox watch")
                self._end.wait(FALLBACK_SECONDS)
        self._close(pubsub)

    @staticmethod
    def _close(pubsub: Optional[Any]) -> None:
        if pubsub is not None:
            try:
                pubsub.close()
            except redis.RedisError:
                pass
        return None

    def stop(self) -> None:
        self._end.set()
        self.join()
