"""What a loop subgraph reads before its first step besides its inputs, read in the same round trip as them.

A loop read, one after the other: its inputs (one MGET), the same-host reference of each chunked input (the data
shard: `ravop.store.same_host`), its checkpoint record (to resume from) and step count (the worker's metrics),
a taken-over loop its checkpoint's tensors (named by the record the takeover's count of attempts read),
its exchanges' readers (a resident replica's `StoreExchange`) and the graph's state and stop request
(`GraphWatch`'s first look). Over a slow link
each is a round trip before the first step (50 ms apiece on the WAN lab's `internet` profile), so the worker
reads them all in the pipeline that reads the inputs, and the loop takes what it needs from here.

The references are asked for every input read from the store (a reference of a tensor that is not chunked is
absent: a few bytes), since which inputs are chunked shows only in their values. A value read here is as fresh
as one read later was: each is written before the loop's message is queued (the plan, the inputs, the
readers), or is the state of a graph that the loop's own watch goes on reading while it runs (state, stop), or
is the checkpoint a previous holder of the message wrote before losing it."""
from typing import Any, Iterable, Optional, Sequence, Union

from ravop.store import same_host
from ravop.store.client_types import Client
from ravop.store.keys import GraphKeys

# The graph meta fields read for the loop: GraphWatch's first look, then StoreExchange's readers.
META_FIELDS = ("state", "stop", "exchange_readers")


class LoopStart:
    """`read(client, input_keys)` reads the loop's inputs and the rest in one pipeline; then `checkpoint` (the
    checkpoint hash, {} for none), `meta` ({field: value or None} of META_FIELDS), `progress` ((steps done, step
    of its checkpoint or None): what the worker's metrics count from, worker.serve.worker_metrics.loop_record)
    and `reference(key)` hold what was read. `ended`: the same pair as the loop left it, set by the loop when it
    completes here (None until then: the metrics read it from the store)."""

    def __init__(self, keys: GraphKeys, subgraph_id: int, prefetch: Iterable[str] = ()) -> None:
        self.keys, self.subgraph_id = keys, subgraph_id
        self.checkpoint: Optional[dict[bytes, bytes]] = None
        self.writing: Optional[bytes] = None   # the step of a checkpoint a worker was writing (loop_subgraph._resume)
        self.meta: Optional[dict[str, Optional[bytes]]] = None
        self.progress: Optional[tuple[int, Optional[int]]] = None
        self.ended: Optional[tuple[int, Optional[int]]] = None
        self.references: dict[str, Optional[bytes]] = {}
        # a takeover's: the keys of the checkpoint tensors its count of attempts found (worker/serve/attempts.py),
        # read here too ({key: bytes}), and used if the checkpoint read here is still that one
        self.prefetch = list(prefetch)
        self.prefetched: dict[str, Optional[bytes]] = {}

    def read(self, client: Client, input_keys: Sequence[str], seals_key: str, ids: Sequence[int]
             ) -> tuple[list[Optional[bytes]], list[Optional[bytes]]]:
        """The values stored under `input_keys` (None where there is none), and the requester's seals of those of
        node ids `ids` that are constants (ravop.store.seals; `seals_key`'s fields), read with the rest."""
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(self.keys.checkpoint(self.subgraph_id))
        pipe.get(self.keys.checkpoint_writing(self.subgraph_id))
        pipe.hmget(self.keys.meta, *META_FIELDS)
        pipe.hget(self.keys.steps, self.subgraph_id)
        if self.prefetch:
            pipe.mget(self.prefetch)
        if input_keys:
            pipe.mget(input_keys)
            pipe.mget([same_host.reference_key(key) for key in input_keys])
            pipe.hmget(seals_key, list(ids))
        checkpoint, self.writing, meta, steps, *inputs = pipe.execute()
        if self.prefetch:
            self.prefetched = dict(zip(self.prefetch, inputs.pop(0)))
        self.checkpoint, self.meta = checkpoint, dict(zip(META_FIELDS, meta))
        saved = checkpoint.get(b"step")
        self.progress = (int(steps or 0), None if saved is None else int(saved))
        if not input_keys:
            return [], []
        values, references, sealed = inputs
        self.references = dict(zip(input_keys, references))
        return values, sealed

    def reference(self, key: str) -> Union[None, bytes, Any]:
        """The same-host reference read for input `key` (None: it has none; `same_host.UNREAD`: not read here)."""
        return self.references.get(key, same_host.UNREAD)
