"""What a worker advertises with each heartbeat, for `ravop status` and the dashboard: device, memory,
threads, what it runs now, when it last beat. One short-lived hash per worker beside its liveness key
(`ravop.store.workers`), so a dead worker's entry expires with it."""
import time
from typing import Any, Dict, List, Mapping, Optional, Union

from ..core.cost_fields import COST_FIELDS
from .client_types import Client, Pipeline
from .keys import DEVICE_KINDS, info_key, workers_set

def advertise(pipe: Pipeline, name: str, info: Mapping[str, Optional[Union[str, int, float]]], ttl: float) -> None:
    """Queue the worker's current `info` (str/int/float values; None leaves a field out) on `pipe`."""
    fields = {k: v for k, v in info.items() if v is not None}
    fields["heartbeat"] = time.time()
    key = info_key(name)
    pipe.delete(key)  # fields that no longer apply (the subgraph just finished) must not linger
    pipe.hset(key, mapping=fields)
    pipe.pexpire(key, int(ttl * 1000))  # ttl may be fractional seconds


_NUMBERS = ("pid", "threads", "memory_limit", "rss", "completed", "subgraph")
_FLOATS = ("heartbeat", "started", "since", *COST_FIELDS)


def read_all(client: Client) -> List[Dict[str, Any]]:
    """Every registered worker whose advertisement has not expired, by name: dicts with name, device, state
    ('running' or 'idle'), and what else the worker sent (numbers and times as numbers)."""
    pipe = client.pipeline(transaction=False)
    for kind in DEVICE_KINDS:
        pipe.smembers(workers_set(kind))
    names = sorted({n.decode() for members in pipe.execute() for n in members})
    for name in names:
        pipe.hgetall(info_key(name))
    workers = []
    for name, raw in zip(names, pipe.execute()):
        if not raw:
            continue  # its heartbeat expired (or it is an older worker that advertises nothing)
        info = {k.decode(): v.decode() for k, v in raw.items()}
        for field in _NUMBERS:
            if field in info:
                info[field] = int(info[field])
        for field in _FLOATS:
            if field in info:
                info[field] = float(info[field])
        workers.append({"name": name, **info})
    return workers
