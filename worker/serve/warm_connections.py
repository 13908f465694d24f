"""Connections a worker opens before it registers.

Each of a worker's threads takes a connection from its client's pool for every command it sends (the main loop,
the heartbeat, the inbox watch, and a running loop's writes, exchange sends, reads ahead, checks and graph watch),
and a thread that finds none idle opens one. Over a slow link that is round trips (TCP, HELLO and its health
check) on the thread's first command: in the WAN lab the main loop's first read of the work stream, and a
replica's first sync, waited for them. So a worker opens `WARM` connections at start, side by side, before it
registers: once it is registered, it takes work, and its loop's threads start, with connections at hand. (An
idle connection is health-checked with one PING before its first use after 30 s, as any pooled one.)"""
import logging
import threading

import redis

from ravop.store.client_types import Client

log = logging.getLogger("ravop.worker")

WARM = 8   # the threads a worker running a resident replica's loop has talking to the store at once, about


def warm(client: Client, count: int = WARM) -> None:
    """Open `count` connections of `client`'s pool at once and leave them idle in it; a connection that fails to
    open is left to be opened when needed (a cluster client's pools, per node, open as it finds the nodes)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return
    opened: list[object] = []

    def open_one() -> None:
        try:
            opened.append(pool.get_connection())
        except (redis.RedisError, OSError) as exc:
            log.debug("a connection opened ahead failed: %s", exc)
    threads = [threading.Thread(target=open_one, daemon=True, name="warm-connection") for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for connection in opened:
        pool.release(connection)
