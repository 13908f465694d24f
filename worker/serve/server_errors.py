"""What a worker does when the server answers with an error instead of work: it never exits for it (only a
revoked login, or an operator's --exit-when-server-gone, ends a worker). Transient errors are waited out,
damaged shared structures repaired where this worker's user may (ravop.store.repair), anything else logged;
then the worker tries again (ravop.store.server_replies classifies them).

Waits grow from FIRST to CAP seconds, doubling, with jitter (so that the workers of a server do not come back
in step, all at once, when it recovers), and return to FIRST after a success. Each episode is logged once when
it starts and once when it ends, not at every try.
"""
import logging
import random
import time
from typing import Optional

import redis

from ravop.store import repair
from ravop.store.client_types import Client
from ravop.store.server_replies import first_line, kind_of

log = logging.getLogger("ravop.worker")

FIRST, CAP = 0.1, 5.0   # seconds: the first wait after an error, and the longest


class ServerErrors:
    """One worker's episodes of server errors: `met(exc)` says how long to wait before trying again (and repairs
    what is damaged), `ok()` ends an episode."""

    def __init__(self, client: Client, name: str, rng: Optional[random.Random] = None) -> None:
        self.client, self.name = client, name
        self.rng = rng or random.Random()
        self.since: Optional[float] = None
        self.delay = FIRST
        self.count = 0
        self.last: Optional[str] = None   # the error last logged

    def met(self, exc: BaseException) -> float:
        """Seconds to wait after `exc`, jittered within [delay/2, delay]."""
        kind, text = kind_of(exc), first_line(exc)
        if self.since is None:
            self.since = time.monotonic()
        if text != self.last:   # once per episode, and again only if the error changes
            log.warning("worker %s: the server answered %s (%s); retrying with backoff, still serving", self.name,
                        text, kind)
            self.last = text
        self.count += 1
        if kind == "damaged":
            self.repair()
        delay, self.delay = self.delay, min(self.delay * 2, CAP)
        return self.rng.uniform(delay / 2, delay)

    def repair(self) -> None:
        """Make the work streams sound (at start, and after a damaged one was met); a user without the rights
        serves anyway, meeting the damage as errors it rides out until someone with them repairs it."""
        try:
            for line in repair.work_streams(self.client):
                log.warning("worker %s: %s", self.name, line)
        except redis.RedisError as exc:
            log.error("worker %s: cannot repair the work streams (%s); any `ravop admin` command, or a worker "
                      "with the rights, does", self.name, first_line(exc))

    def ok(self) -> None:
        """The server answered normally: end the episode (logged) and reset the backoff."""
        if self.since is None:
            return
        log.warning("worker %s: the server answers normally again after %.1f s (%d errors)", self.name,
                    time.monotonic() - self.since, self.count)
        self.since, self.delay, self.count, self.last = None, FIRST, 0, None

