"""The speed of this worker's link to the store, measured once at start and advertised with its capabilities
(`ravop.store.worker_info`), so placement (ravop.parallel.placement) and `R.activate()`'s summary can rank
workers by how fast they move a replica's state: one PROBE_BYTES value written into and read back from the
worker's own advertisement hash (a key its ACL user may write), then removed."""
import os
import time

from ravop.store.worker_info import info_key

PROBE_BYTES = 1 << 20
PROBE_FIELD = "link_probe"


def measure(client, name):
    """Bytes per second of one write and one read of PROBE_BYTES to the store."""
    payload = os.urandom(PROBE_BYTES)
    key = info_key(name)
    start = time.perf_counter()
    client.hset(key, PROBE_FIELD, payload)
    client.hget(key, PROBE_FIELD)
    seconds = time.perf_counter() - start
    client.hdel(key, PROBE_FIELD)
    return 2 * PROBE_BYTES / max(seconds, 1e-9)
