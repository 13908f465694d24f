"""Which workers are alive: each renews a short-lived key from its heartbeat thread. Workers take over the work
of those whose key has expired; requesters read them to tell a user that work is waiting for a kind of worker
that nobody runs."""
from typing import Iterable, List, Sequence

import redis

from .client_types import Client, Pipeline

from .keys import worker_key, workers_set

TTL = 3.0  # seconds a worker counts as alive after its last heartbeat (ravop-worker --dead-after)


def beat(pipe: Pipeline, name: str, kind: str, ttl: float = TTL) -> None:
    pipe.set(worker_key(name), kind, px=max(1, int(ttl * 1000)))
    pipe.sadd(workers_set(kind), name)


def leave(client: Client, name: str, kind: str) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.delete(worker_key(name))
    pipe.srem(workers_set(kind), name)
    pipe.execute()


def _live(client: Client, names: Sequence[str]) -> List[str]:
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.exists(worker_key(name))
    return [name for name, exists in zip(names, pipe.execute()) if exists]


def silent(client: Client, names: Sequence[str]) -> List[str]:
    """Those of `names` whose heartbeat key has expired (or never existed)."""
    if not names:
        return []
    live = set(_live(client, names))
    return [name for name in names if name not in live]


def alive(client: Client, kind: str) -> List[str]:
    """Names of the live workers of a device kind (forgetting those whose heartbeat expired)."""
    names = sorted(n.decode() for n in client.smembers(workers_set(kind)))
    if not names:
        return []
    live = _live(client, names)
    forget(client, workers_set(kind), set(names) - set(live))
    return live


def forget(client: Client, key: str, names: Iterable[str]) -> None:
    """Remove `names` of expired workers from the set `key`. A requester's ACL user may only read these
    sets (ravop.store.access), so the workers' next reads prune them instead."""
    if names:
        try:
            client.srem(key, *names)
        except redis.exceptions.NoPermissionError:
            pass


def acl_user(client: Client) -> str:
    """The ACL user `client` is signed in as ('default' on a server without users, or one older than ACLs):
    whose vote a worker's is under verify= (ravop.core.spot_policy.principal_of)."""
    try:
        user = client.acl_whoami()
    except redis.exceptions.ResponseError:   # no ACL command (Redis < 6): every client is the default user
        return "default"
    return user.decode() if isinstance(user, bytes) else str(user)
