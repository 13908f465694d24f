"""A replica's values kept by the worker that handed its loop back to take turns (worker/loops/hand_back.py), so that
taking the same replica back costs no checkpoint download: its shard is in the worker's tensor cache already
(`TensorCache`, keyed by the shard's Redis key), and its carried values are put there too, under the keys of
the checkpoint written as it handed back. Those keys name the step, and a loop's values at a step are the same
bits wherever it ran, so a kept value is used only when the loop's checkpoint still names that step (another
worker that took the loop further wrote a later one) and is never stale. The cache's byte bound and LRU order
apply to them as to any value; an evicted one is read from the store."""
import logging
from typing import Any, Mapping, Optional, Sequence

import torch

from ravop.store import tensors as stored
from ravop.store.client_types import Client

from ..execute.cache import TensorCache

log = logging.getLogger("ravop.worker")


def keep(cache: TensorCache, names: Sequence[str], carried: Sequence[torch.Tensor]) -> None:
    """Copies of `carried` (what the checkpoint just written holds) under its tensors' keys `names`."""
    for name, value in zip(names, carried):
        cache.put(name, value.detach().clone(memory_format=torch.contiguous_format))


def read(client: Client, cache: Optional[TensorCache], names: dict[int, str],
         prefetched: Optional[Mapping[str, Optional[bytes]]] = None) -> dict[int, Optional[torch.Tensor]]:
    """{k: tensor} of the checkpoint tensors `names` ({k: key}): fresh copies of those this worker kept (the loop
    resumed from them updates them in place), the others from `prefetched` ({key: stored bytes}, read with the
    loop's inputs: worker/loops/loop_start.py) or the store, in one MGET (None where it has none)."""
    prefetched = prefetched or {}
    kept = {k: cache.get(name) if cache is not None else None for k, name in names.items()}
    # a value prefetched as absent is read again: the checkpoint that named it may have been replaced meanwhile
    missing = [name for k, name in names.items() if kept[k] is None and prefetched.get(name) is None]
    data = {**prefetched, **dict(zip(missing, client.mget(missing)))} if missing else prefetched
    values: dict[int, Optional[torch.Tensor]] = {}
    from_store = 0
    for k, name in names.items():
        held = kept[k]
        if held is None:
            raw = data[name]
            value, from_store = None if raw is None else stored.decode(client, name, raw), from_store + 1
        else:
            value = held.clone()
        values[k] = value
    if from_store < len(names):
        log.info("checkpoint %s: %d of %d values kept by this worker, not read from the store",
                 names[next(iter(names))].rsplit(":", 1)[0], len(names) - from_store, len(names))
    return values
