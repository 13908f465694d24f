"""Checkpoint values stored once for all the loops of a graph. Right after a synchronisation every DiLoCo replica
carries the same global model, bit for bit (each adds the same update to the same model with the same ops), so
replicas that checkpoint at the same synchronisation (worker/loops/sync_cadence.py makes them) need it in the store
once, not once each: one model size less up each provider's link per checkpoint, of the 4-6 a replica's holds
(its optimizer moments and error-feedback residuals are its own, and stay).

Each value of a checkpoint taken by a loop that exchanges values is stored under a key named by its digest
(`ckpt:v:{digest}`: BLAKE2b of its dtype, shape and bytes), and the checkpoint hash names it (`shared`:
"k=digest,..."). The replicas reach a synchronisation within moments of each other, so each value is claimed
first (SET NX of `ckpt:v:{digest}:claim`, expiring after the time its upload may take): the loop that claims a
value the store lacks uploads it with its checkpoint, the others wait until it is there (or the claim lapses:
its holder died; then one of them claims it). Claims are taken in one order, so no two loops wait on each other.
Each checkpoint that names a value is a member of its set of references (`ckpt:v:{digest}:refs`,
"{loop}:{step}"), added in the transaction that publishes the checkpoint. A loop that replaces (or drops) its
checkpoint removes its references, and deletes a value no checkpoint names any longer. Both sides are
optimistic transactions: a writer that found a value watches it (if the last reference goes and the value
is deleted before the writer's transaction, the transaction fails and the writer uploads it), and a deleter
watches the references (a checkpoint that names the value meanwhile keeps it). A value read back is checked
against its digest, so a resumed loop gets the bits its checkpoint named or a clear error."""
import hashlib
import time
from typing import Any, Collection, Optional, Sequence

import redis
import torch

from ravop.core.errors import PlanError
from ravop.store import tensors as stored
from ravop.store.client_types import Client, Pipeline
from ravop.store.keys import GraphKeys

# how long a claim to upload a value holds without the value appearing (its holder died): long enough for an
# upload at CLAIM_RATE bytes/s, and CLAIM_SECONDS at least
CLAIM_SECONDS, CLAIM_RATE = 10.0, 1e6
POLL_SECONDS = (0.005, 0.1)   # first and longest pause between two looks at values others are uploading


def digest(value: torch.Tensor) -> str:
    """Hex BLAKE2b (128 bits) of a host tensor's dtype, shape and bytes."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{value.dtype}:{tuple(value.shape)}:".encode())
    h.update(value.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def value_key(keys: GraphKeys, name: str) -> str:
    return f"{keys.checkpoint('v')}:{name}"


def refs_key(keys: GraphKeys, name: str) -> str:
    return f"{value_key(keys, name)}:refs"


def holder(subgraph_id: int, step: int) -> str:
    """The reference a checkpoint (loop `subgraph_id` at `step`) holds on its shared values."""
    return f"{subgraph_id}:{step}"


def choose(host: Sequence[Any], skip: Collection[int]) -> dict[int, str]:
    """{k: digest} of the tensors of `host` but for `skip` (aliases of others)."""
    return {k: digest(value) for k, value in enumerate(host) if k not in skip and isinstance(value, torch.Tensor)}


def claim_key(keys: GraphKeys, name: str) -> str:
    return f"{value_key(keys, name)}:claim"


def settle(client: Client, keys: GraphKeys, host: Optional[Sequence[Any]], shared: dict[int, str], who: str) -> None:
    """Claim for checkpoint `who` the values of `shared` ({k: digest}) the store lacks, and wait for those another
    loop claimed until they are there (or their claim lapsed: its holder died; then this one claims them). Claims
    are taken in the order of the digests and none is held past one being waited for, so no two loops wait on
    each other. The values claimed here are uploaded by the checkpoint's transaction (`write`). One round trip a
    look (two when it lets claims go)."""
    if not shared:
        return   # no checkpoint (`host` None), or none of its values shared
    if host is None:
        raise ValueError("shared checkpoint values without the checkpoint's values")
    first: dict[str, int] = {}
    for k, name in shared.items():
        first.setdefault(name, k)
    waiting, pause = sorted(first), POLL_SECONDS[0]
    while waiting:
        look = client.pipeline(transaction=False)
        for name in waiting:
            seconds = max(CLAIM_SECONDS, host[first[name]].nbytes / CLAIM_RATE)
            look.exists(value_key(keys, name))
            look.set(claim_key(keys, name), who, nx=True, px=int(seconds * 1000))
            look.get(claim_key(keys, name))
        replies = look.execute()
        blocked: list[str] = []
        let_go: list[str] = []
        for at, name in enumerate(waiting):
            there, _, claimer = replies[3 * at:3 * at + 3]
            if there:
                if claimer == who.encode():
                    let_go.append(name)   # claimed as it appeared: no one needs the claim
                continue
            if claimer != who.encode():
                blocked.append(name)   # another loop uploads it
            elif blocked:
                blocked.append(name)   # claimed past one waited for: let it go, claim it again in order
                let_go.append(name)
        if let_go:
            client.delete(*(claim_key(keys, name) for name in let_go))
        waiting = blocked
        if waiting:
            time.sleep(pause)
            pause = min(pause * 2, POLL_SECONDS[1])


def watch_present(pipe: Pipeline, client: Client, keys: GraphKeys, shared: dict[int, str]) -> set[str]:
    """WATCH the shared values named in `shared` on transaction `pipe` and return the digests the store holds
    (call `pipe.multi()` next; the transaction fails with WatchError if one of them is deleted meanwhile)."""
    names = sorted(set(shared.values()))
    if not names:
        return set()
    pipe.watch(*(value_key(keys, name) for name in names))
    look = client.pipeline(transaction=False)
    for name in names:
        look.exists(value_key(keys, name))
    return {name for name, there in zip(names, look.execute()) if there}


def write(pipe: Pipeline, chunks: Optional[Pipeline], keys: GraphKeys, host: Sequence[Any], shared: dict[int, str],
          present: Collection[str], who: str, size: Optional[int]) -> None:
    """Queue, in the transaction `pipe`, the shared values the store lacks and the checkpoint `who`'s references."""
    written = set(present)
    for k, name in shared.items():
        if name not in written:
            stored.write(pipe, value_key(keys, name), host[k], size, chunks)
            pipe.delete(claim_key(keys, name))
            written.add(name)
        pipe.sadd(refs_key(keys, name), who)


def release(client: Client, keys: GraphKeys, shared: dict[int, str], who: str) -> None:
    """Remove the references checkpoint `who` held on `shared` ({k: digest}) and delete the values no checkpoint
    names any longer (unless one comes to name it meanwhile). Three round trips, whatever the number."""
    names = sorted(set(shared.values()))
    if not names:
        return
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.srem(refs_key(keys, name), who)
    pipe.execute()
    with client.pipeline(transaction=True) as tx:
        while names:
            try:
                tx.watch(*(refs_key(keys, name) for name in names))
                look = client.pipeline(transaction=False)
                for name in names:
                    look.exists(refs_key(keys, name))
                names = [name for name, named in zip(names, look.execute()) if not named]
                if not names:
                    return
                tx.multi()
                for name in names:
                    tx.delete(*stored.keys_of(value_key(keys, name)))
                tx.execute()
                return
            except redis.WatchError:   # a checkpoint named one meanwhile: look again
                continue


def check(value: torch.Tensor, name: str, where: str) -> torch.Tensor:
    """`value` read for a checkpoint's shared value `name`; PlanError (naming `where`) if its bits differ."""
    if digest(value) != name:
        raise PlanError(f"{where}: a shared value read back does not match its digest {name}")
    return value


def encode(shared: dict[int, str]) -> str:
    """The checkpoint hash's `shared` field: "k=digest,..." ("" when none)."""
    return ",".join(f"{k}={name}" for k, name in sorted(shared.items()))


def decode(field: Optional[bytes], n: int) -> dict[int, str]:
    """{k: digest} from a `shared` field (bytes, or None for a checkpoint written without one); ValueError if
    malformed."""
    if not field:
        return {}
    shared: dict[int, str] = {}
    for pair in field.decode().split(","):
        slot, sep, name = pair.partition("=")
        k = int(slot)
        if not sep or not 0 <= k < n or k in shared or len(name) != 32 or \
                any(c not in "0123456789abcdef" for c in name):
            raise ValueError(f"bad shared checkpoint value {pair!r}")
        shared[k] = name
    return shared
