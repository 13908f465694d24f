"""Following the graph of a running loop from a thread beside it: every `WATCH_SECONDS` one HMGET of the graph's
state and stop request, so that the loop learns of a cancel (or a failure elsewhere) and of a stop request within
a fraction of a second, whatever its flushes' spacing (worker/loop_subgraph.py spaces them to a 20th of its time
on a slow link), at the cost of one attribute read per step. The loop never waits for this round trip; a
lost connection here is ignored (the loop's own writes report it)."""
import logging
import threading

import redis

from ravop import graph_states

log = logging.getLogger("ravop.worker")

WATCH_SECONDS = 0.25
_RUNNING = graph_states.RUNNING.encode()


class GraphWatch(threading.Thread):
    """`ended`: the graph's state once it is no longer running (bytes), else None; `stop_reason`: why a stop was
    requested (str), else None. The first look is taken by `start`, before the loop runs its first step (or given
    to it: the meta's fields as the worker read them with the loop's inputs, worker/loop_start.py)."""

    def __init__(self, client, keys, interval=WATCH_SECONDS):
        super().__init__(name=f"watch-{keys.graph_id}", daemon=True)
        self.client, self.keys, self.interval = client, keys, interval
        self.ended = self.stop_reason = None
        self._done = threading.Event()

    def look(self):
        self._seen(*self.client.hmget(self.keys.meta, "state", "stop"))

    def _seen(self, state, stop):
        if stop is not None:
            self.stop_reason = stop.decode(errors="replace")
        if state != _RUNNING:
            self.ended = state if state is not None else b"gone"

    def start(self, meta=None):
        """Look (or take `meta`'s "state" and "stop"), then go on looking beside the loop."""
        if meta is None:
            self.look()
        else:
            self._seen(meta["state"], meta["stop"])
        super().start()

    def run(self):
        while not self._done.wait(self.interval):
            try:
                self.look()
            except redis.RedisError as exc:
                log.debug("watching graph %s: %s", self.keys.graph_id, exc)

    def stop_requested(self):
        return self.stop_reason is not None

    def close(self):
        """Stop looking; waits for a look under way only briefly (in an outage it may hang until its timeout,
        and the thread, a daemon, ends after it)."""
        self._done.set()
        if self.is_alive():
            self.join(timeout=1.0)
