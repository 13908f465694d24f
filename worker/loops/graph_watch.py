"""Following the graph of a running loop from a thread beside it: every `WATCH_SECONDS` one HMGET of the graph's
state and stop request, so that the loop learns of a cancel (or a failure elsewhere) and of a stop request within
a fraction of a second, whatever its flushes' spacing (worker/loops/loop_subgraph.py spaces them to a 20th of its time
on a slow link), at the cost of one attribute read per step. The loop never waits for this round trip; a
lost connection here is ignored (the loop's own writes report it).

One thread of the process looks for every loop it runs (`Looker`), started with the first: a thread started and
joined per loop cost a short loop (a digits fit, 40 ms) ~0.35 ms of its time."""
import logging
import os
import threading
import time
from typing import Mapping, Optional, Protocol

import redis

from ravop.core import graph_states
from ravop.store.client_types import Client
from ravop.store.keys import GraphKeys

log = logging.getLogger("ravop.worker")

WATCH_SECONDS = 0.25
CLOSE_WAIT_SECONDS = 1.0   # how long `close` waits for its look under way (in an outage it may hang to its timeout)
_RUNNING = graph_states.RUNNING.encode()


class Watched(Protocol):
    """What the looking thread looks at: a GraphWatch, or a loop's turns (worker/loops/turns.py)."""
    keys: GraphKeys
    interval: float

    def look(self) -> None: ...


class GraphWatch:
    """`ended`: the graph's state once it is no longer running (bytes), else None; `stop_reason`: why a stop was
    requested (str), else None. The first look is taken by `start`, before the loop runs its first step (or given
    to it: the meta's fields as the worker read them with the loop's inputs, worker/loops/loop_start.py); the next ones
    every `interval` seconds after the end of the one before, until `close`."""

    def __init__(self, client: Client, keys: GraphKeys, interval: float = WATCH_SECONDS) -> None:
        self.client, self.keys, self.interval = client, keys, interval
        self.ended: Optional[bytes] = None
        self.stop_reason: Optional[str] = None
        self.looker: Optional[Looker] = None   # the Looker it was given to by `start`

    def look(self) -> None:
        self._seen(*self.client.hmget(self.keys.meta, "state", "stop"))

    def _seen(self, state: Optional[bytes], stop: Optional[bytes]) -> None:
        if stop is not None:
            self.stop_reason = stop.decode(errors="replace")
        if state != _RUNNING:
            self.ended = state if state is not None else b"gone"

    def start(self, meta: Optional[Mapping[str, Optional[bytes]]] = None) -> None:
        """Look (or take `meta`'s "state" and "stop"), then go on looking beside the loop."""
        if meta is None:
            self.look()
        else:
            self._seen(meta["state"], meta["stop"])
        self.looker = _looker()
        self.looker.add(self)

    def stop_requested(self) -> bool:
        return self.stop_reason is not None

    def close(self) -> None:
        """Stop looking; waits for a look under way only briefly (CLOSE_WAIT_SECONDS)."""
        if self.looker is not None:
            self.looker.remove(self)


class Looker(threading.Thread):
    """The process's thread that looks for every started GraphWatch when its next look is due."""

    def __init__(self) -> None:
        super().__init__(name="graph-watch", daemon=True)
        self.pid = os.getpid()
        self.changed = threading.Condition()
        self.due: dict[Watched, float] = {}         # GraphWatch -> time.monotonic() of its next look
        self.looking: Optional[Watched] = None   # the GraphWatch whose look is under way

    def add(self, watch: Watched) -> None:
        with self.changed:
            self.due[watch] = time.monotonic() + watch.interval
            self.changed.notify()

    def remove(self, watch: Watched) -> None:
        with self.changed:
            self.due.pop(watch, None)
            self.changed.wait_for(lambda: self.looking is not watch, CLOSE_WAIT_SECONDS)

    def run(self) -> None:
        with self.changed:
            while True:
                if not self.due:
                    self.changed.wait()
                    continue
                watch = min(self.due, key=self.due.__getitem__)
                wait = self.due[watch] - time.monotonic()
                if wait > 0:
                    self.changed.wait(wait)
                    continue
                self.looking = watch
                self.changed.release()
                try:
                    watch.look()
                    looked = True
                except redis.RedisError as exc:
                    log.debug("watching graph %s: %s", watch.keys.graph_id, exc)
                    looked = True
                except Exception:   # noqa: BLE001 - as a thread of its own would have: this loop goes unwatched
                    log.exception("watching graph %s", watch.keys.graph_id)
                    looked = False
                finally:
                    self.changed.acquire()
                    self.looking = None
                    self.changed.notify_all()
                if watch in self.due:
                    if looked:
                        self.due[watch] = time.monotonic() + watch.interval
                    else:
                        del self.due[watch]


_lock = threading.Lock()
_instance: Optional[Looker] = None


def _looker() -> Looker:
    """The process's Looker, started on first use (again in a forked child: threads do not survive a fork)."""
    global _instance
    with _lock:
        if _instance is None or _instance.pid != os.getpid():
            _instance = Looker()
            _instance.start()
        return _instance


def look_beside(watch: Watched) -> Looker:
    """Look at `watch` (anything with `look()`, `keys` and `interval`: worker/loops/turns.py) every interval in the
    process's looking thread too; returns that thread, to `remove` it from."""
    looker = _looker()
    looker.add(watch)
    return looker
