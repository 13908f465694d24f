"""Which workers are alive: each renews a short-lived key; requesters read them to tell a user that work is
waiting for a kind of worker that nobody runs."""
from .keys import worker_key, workers_set

TTL = 10  # seconds a worker counts as alive after its last heartbeat


def beat(pipe, name, kind, ttl=TTL):
    pipe.set(worker_key(name), kind, ex=ttl)
    pipe.sadd(workers_set(kind), name)


def leave(client, name, kind):
    pipe = client.pipeline(transaction=False)
    pipe.delete(worker_key(name))
    pipe.srem(workers_set(kind), name)
    pipe.execute()


def alive(client, kind):
    """Names of the live workers of a device kind (forgetting those whose heartbeat expired)."""
    names = sorted(n.decode() for n in client.smembers(workers_set(kind)))
    if not names:
        return []
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.exists(worker_key(name))
    live = [name for name, exists in zip(names, pipe.execute()) if exists]
    dead = set(names) - set(live)
    if dead:
        client.srem(workers_set(kind), *dead)
    return live
