"""Who may do what on a shared server: the Redis ACL rules of a requester's user and of a worker's user
(`ravop admin`, ravop/admin.py). Everything not listed is refused by the server itself, so a requester or
a worker running modified code is held to these rules, not to what our code happens to send.

- A requester reads and writes only its own token's keys, enqueues on the work streams, and reads which
  workers and providers are alive. It cannot read another token's graphs, tensors, results or failures,
  cannot flush or list the database, and cannot touch server settings or other users.
- A worker claims and acks work, reads any graph's plan and tensors (it is given subgraphs of every token;
  Redis cannot narrow a key pattern to "what you claimed") and writes outputs, progress and dead letters.
  It may delete only what its protocol deletes: released tensors, its checkpoints, exchanged values every reader
  has checkpointed past, its own liveness keys.
  It cannot delete, flush or list graphs, nor clear its own name from a token's banned set. It writes a token's
  spot-check trust records (`trust`), through the SPOT script (R.Graph(verify='spot')), which runs under its user.
"""
from typing import Any, List, Mapping, Optional

from .keys import (ANY, FEDERATED_OPEN, PROVIDERS, STARTING, banned_pattern, checkpoints_pattern, exchanges_pattern,
                   graphs_pattern, info_key, provider_key, queue, shared_pattern, tensors_pattern, token_pattern,
                   trust_pattern, worker_key, workers_set)

# Commands without keys that our clients send: connection setup (redis-py's AUTH, SELECT; not CLIENT SETINFO,
# which Redis 7.0 does not know and redis-py does without) and the scripts (loaded by SHA, EVAL as the
# fallback). `info` gives maxmemory and used memory, checked before big writes (ravop.store.tensors); CONFIG
# is not granted: CONFIG GET reveals passwords. Granted after _DATA, since INFO is in @dangerous. On a cluster,
# redis-py asks any node for the slot map (CLUSTER SLOTS, or CLUSTER SHARDS) and where commands name their keys
# (COMMAND: the server's command table, nothing of its data).
_KEYLESS = ["+ping", "+hello", "+auth", "+select", "+echo", "+quit", "+reset",
            "+cluster|slots", "+cluster|shards", "+command",
            "+client|setname", "+client|getname", "+client|id", "+info",
            "+multi", "+exec", "+discard", "+watch", "+unwatch",
            "+eval", "+evalsha", "+script|load", "+script|exists", "+time"]
_DATA = ["+@read", "+@write", "-@dangerous", "-@admin", "-function", "-keys", "-randomkey", "-move", "-copy"]


def requester_rules(namespace: str) -> List[str]:
    """ACL SETUSER arguments (after the name) that confine a requester to token `namespace`."""
    return ["resetkeys", "resetchannels", "-@all", *_DATA, *_KEYLESS,
            f"~{token_pattern(namespace)}",
            f"%RW~{queue(ANY)}", f"%RW~{STARTING}",      # start a graph (ravop.store.handoff)
            f"%RW~{FEDERATED_OPEN}",                     # open a federated one to providers
            f"%R~{worker_key(ANY)}", f"%R~{workers_set(ANY)}", f"%R~{info_key(ANY)}",
            f"%R~{PROVIDERS}", f"%R~{provider_key(ANY)}"]


def worker_rules() -> List[str]:
    """ACL SETUSER arguments (after the name) of a worker."""
    deletable = [tensors_pattern(), checkpoints_pattern(), exchanges_pattern(), worker_key(ANY), info_key(ANY),
                 provider_key(ANY)]
    return ["resetkeys", "resetchannels", "-@all", *_DATA, *_KEYLESS,
            "-scan", "-del", "-unlink", "-xtrim", "-xgroup|destroy", "-xgroup|setid",
            f"~{graphs_pattern()}", f"~{shared_pattern()}", f"%R~{banned_pattern()}",
            f"%RW~{trust_pattern()}",   # the SPOT script's trust records (verify='spot')
            "(+del +unlink " + " ".join(f"~{pattern}" for pattern in deletable) + ")",
            f"(+sadd ~{banned_pattern()})"]   # a worker marks a disagreeing one; it cannot unmark itself


def kind_of(name: str, user: Mapping[str, Any]) -> Optional[str]:
    """'token', 'worker' or None (any other user) from redis-py's `acl_getuser(name)`, by the keys granted."""
    patterns = user.get("keys") or []
    if f"~{graphs_pattern()}" in patterns:
        return "worker"
    if f"~{token_pattern(name)}" in patterns:
        return "token"
    return None
