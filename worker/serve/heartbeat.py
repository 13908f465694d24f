"""A worker's heartbeat thread. Every `interval` seconds it renews the worker's liveness key for `ttl` seconds
(other workers take over the work of a worker whose key expired: worker/serve/takeover.py; requesters use it to say
"waiting for a GPU worker"), and re-claims the message being run so that its idle time stays low: a subgraph
that runs for minutes is not mistaken for one held by a dead worker. It
also notices when the process that started an embedded worker has gone, and asks the worker to stop.
Torch kernels release the GIL, so the thread runs while a long kernel does; it is also how a worker whose user
was revoked learns it within an interval while it computes."""
import logging
import os
import threading
import time
from typing import Any, Optional, Sequence

import redis

from ravop.store import GROUP
from ravop.store import federated_schema as federated_store
from ravop.store import worker_info
from ravop.store import workers as liveness
from ravop.store.client_types import Client

from ..execute.memory import resident_bytes

log = logging.getLogger("ravop.worker")


class Heartbeat(threading.Thread):
    def __init__(self, client: Client, name: str, kind: str, stream: str, interval: float, ttl: float,
                 stopping: threading.Event, parent_pid: Optional[int] = None,
                 data_columns: Optional[Sequence[str]] = None, info: Optional[dict[str, Any]] = None) -> None:
        super().__init__(name=f"heartbeat-{name}", daemon=True)
        self.info = {**(info or {}), "state": "idle", "started": time.time()}  # advertised with each beat
        self.client, self.name, self.kind, self.stream = client, name, kind, stream
        self.interval, self.ttl = interval, ttl
        self.stopping = stopping      # threading.Event the worker loop watches
        self.parent_pid = parent_pid
        self.data_columns = data_columns  # a data provider's columns, advertised with its liveness
        self.message_id: Optional[bytes] = None   # the message being run, if any
        self.revoked = False          # the server refused this worker's login: its user was revoked
        self._end = threading.Event()

    def watch(self, message_id: bytes, graph_id: Optional[str] = None, subgraph_id: Optional[int] = None) -> None:
        self.message_id = message_id
        self.info.update(state="running", graph=graph_id, subgraph=subgraph_id, since=time.time())

    def unwatch(self) -> None:
        self.message_id = None
        self.info.update(state="idle", graph=None, subgraph=None, since=None)

    def beat(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        liveness.beat(pipe, self.name, self.kind, ttl=self.ttl)
        worker_info.advertise(pipe, self.name, {**self.info, "rss": resident_bytes()}, self.ttl)
        if self.data_columns is not None:
            federated_store.advertise(pipe, self.name, self.data_columns, ttl=self.ttl)
        message_id = self.message_id
        if message_id is not None:
            # JUSTID: resets the idle time without counting a delivery.
            pipe.xclaim(self.stream, GROUP, self.name, 0, [message_id], justid=True)
        pipe.execute()

    def run(self) -> None:
        while not self._end.wait(self.interval):
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                log.warning("worker %s: the process that started it has exited; stopping", self.name)
                self.stopping.set()
            try:
                self.beat()
            except redis.AuthenticationError as exc:   # `ravop admin worker revoke`: felt within an interval
                log.error("worker %s: Redis refused its credentials (%s); stopping after the subgraph it runs",
                          self.name, exc)
                self.revoked = True
                self.stopping.set()
                return
            except redis.RedisError as exc:  # the worker loop deals with a lost server; keep beating
                log.debug("heartbeat of %s failed: %s", self.name, exc)

    def stop(self) -> None:
        self._end.set()
        self.join()

