"""Who may do what on a shared server: the Redis ACL rules of a requester's user and of a worker's user
(`ravop admin`, ravop/tools/admin.py), as allow-lists. Each role is granted exactly the commands its protocol
sends, each on the key patterns it sends them to (ACL selectors); everything else is refused by the server
itself, so a requester or a worker running modified code is held to these grants, not to what our code
happens to send. tests/security/test_acl.py records what real runs send and checks it against these tables, and
tries every write and administrative command of the server's COMMAND DOCS on every key class.

Scripts run with the caller's permissions (Redis 6.2 and 7+, Valkey: a script cannot do what its caller
may not), so scripts cannot widen a grant: they only make several granted steps atomic. Hence:

- A requester writes only under its own token, and reads the worker registry. It runs no scripts (a long
  one would make the server answer BUSY to everyone), touches no work stream, dead letter, starting mark,
  federated set or registry: it starts a graph by naming it in its token's inbox, and a worker starts it
  (ravop.store.inbox). docs/operators/security.md has the design and the threat model.
- A worker writes what running subgraphs writes, each command on the graph keys that need it (tensors,
  checkpoints, progress, its votes), acks and hands off work on the work streams, dead-letters, and keeps
  its liveness keys. ACL cannot narrow a key pattern to "the graph you claimed", nor tell the meta write of
  the completion script from a forged one: what a worker can still do to any graph is listed in the threat
  model (docs/operators/security.md), and `R.Graph(verify=k)` is the answer to a worker that lies.
"""
from fnmatch import fnmatchcase
from typing import Any, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from .keys import (ANY, DEAD_LETTER, FEDERATED_OPEN, PROVIDERS, STARTED, STARTING, TOKENS, banned_pattern, graph_prefix,
                   inbox_pattern, info_key, principal_key, provider_key, queue, quota_key, token_pattern,
                   token_prefix, trust_pattern, usage_key, worker_key, workers_set)

REQUESTER, WORKER = "requester", "worker"


class Grant(NamedTuple):
    """`commands` (lower case, `container|sub` for a subcommand) on keys matching any of `patterns`."""
    what: str
    patterns: Tuple[str, ...]
    commands: Tuple[str, ...]


# Keyless commands both roles send: connection setup (redis-py's HELLO, AUTH, SELECT, CLIENT SETNAME; not
# CLIENT SETINFO, which Redis 7.0 does not know and redis-py does without), transactions (WATCH names keys:
# granted with them) and, on a cluster, the slot map (CLUSTER SLOTS or SHARDS) and where commands name their
# keys (COMMAND: the server's command table, nothing of its data). `info` gives maxmemory and used memory,
# checked before big writes (ravop.store.tensors); CONFIG is not granted: CONFIG GET reveals passwords.
_CONNECTION = ("ping", "hello", "auth", "select", "echo", "quit", "reset", "cluster|slots", "cluster|shards",
               "command", "client|setname", "client|getname", "client|id", "info", "time",
               "multi", "exec", "discard", "unwatch")
# SCAN: a requester deletes its token's keys by pattern where its records may not name them all
# (ravop.store.flush). It lists key names of other tokens too (never values): token names and graph ids are
# not secrets (a token that is one is only ever stored as a digest, ravop.store.keys.token_namespace).
# PUBLISH (on the STARTED channel only): a token user rings the workers after posting to its inbox.
REQUESTER_KEYLESS = _CONNECTION + ("scan", "publish")
# Workers run the project's scripts (they load them after a server restart). See docs/operators/security.md for
# what a script may cost the server and how long it may block it.
# SCAN: the keys of a token with a memory quota are sized before its outputs are stored (ravop.store.quotas).
# ACL WHOAMI: a worker's votes count per ACL user (ravop.core.spot_policy.principal_of).
WORKER_KEYLESS = _CONNECTION + ("script|load", "script|exists", "subscribe", "unsubscribe", "scan", "acl|whoami")
CHANNELS = (STARTED,)  # the only pub/sub channel either role may use

_READ_STRING = ("get", "mget", "strlen", "exists")
_READ_HASH = ("hget", "hmget", "hgetall", "hkeys", "hvals", "hlen", "hexists", "hstrlen")
_READ_SET = ("smembers", "sismember", "scard")
_READ_ZSET = ("zrange", "zrevrange", "zrangebyscore", "zscore", "zcard")
_READ_STREAM = ("xread", "xrange", "xrevrange", "xlen")

# What only reads (the threat model's table says "read" for these, ravop.store.threat_model).
READS = frozenset(_READ_STRING + _READ_HASH + _READ_SET + _READ_ZSET + _READ_STREAM +
                  ("type", "watch", "xpending", "xinfo|stream", "xinfo|groups", "memory|usage"))


def _registry() -> Tuple[str, ...]:
    """Worker and provider liveness and advertisements (ravop.store.workers, worker_info, federated_schema)."""
    return (worker_key(ANY), workers_set(ANY), info_key(ANY), PROVIDERS, provider_key(ANY))


def requester_grants(namespace: str) -> List[Grant]:
    """What the token user `namespace` may do (besides REQUESTER_KEYLESS)."""
    return [
        Grant("own token keys", (token_pattern(namespace),),
              _READ_STRING + _READ_HASH + _READ_SET + _READ_ZSET + _READ_STREAM + ("type", "watch") +
              ("set", "hset", "hdel", "hincrby", "sadd", "srem", "zadd", "zrem", "xadd", "del", "unlink")),
        # what its keys hold, checked against its memory quota before an upload (ravop.store.quotas)
        Grant("own token keys: sizes", (token_pattern(namespace),), ("memory|usage",)),
        Grant("own quota and usage", (quota_key(namespace), usage_key(namespace)), _READ_HASH),
        Grant("worker registry", _registry(), _READ_STRING + _READ_SET + ("hgetall", "hget", "hmget")),
    ]


def _graph(*suffixes: str) -> Tuple[str, ...]:
    return tuple(graph_prefix(ANY, ANY) + suffix for suffix in suffixes)


def worker_grants(user: str = "") -> List[Grant]:
    """What worker user `user` may do (besides WORKER_KEYLESS): each write command only where the protocol sends
    it. Its scripts may name its own principal key only: its spot-check votes are its user's, whatever it claims."""
    streams = (queue(ANY),)
    return [
        Grant("graph keys: read", _graph(ANY), _READ_STRING + _READ_HASH + ("smembers", "sismember", "watch")),
        # outputs (t:{node}, chunks t:{node}:c), a loop's checkpointed values (ckpt:...) and a resident
        # replica's exchanged values (x:...)
        Grant("graph keys: tensors", _graph("t:*", "ckpt:*", "x:*"), ("set",)),
        # a resident replica's count of the loops that read an exchanged value (worker/loops/exchange.py)
        Grant("graph keys: exchange acknowledgements", _graph("x:*"), ("incrby",)),   # redis-py sends INCR as INCRBY
        # released inputs (COMPLETE), checkpoints a loop replaces, outputs of a graph flushed meanwhile,
        # exchanged values every reader has checkpointed past (DEL only: no worker code sends UNLINK)
        Grant("graph keys: deletable", _graph("t:*", "ckpt:*", "x:*"), ("del",)),
        # completion and failure (meta, taken, ran, held: the scripts), hand-off (outbox), loops (steps, ckpt:*),
        # takeovers (attempts: worker/serve/attempts.py), verify='spot' (a loop's segments segs:*, dispute traces
        # traces:*), federated providers (clients, partials, public_keys, and a secure graph's shares and reveals:
        # encrypted to their recipients, or checked against commitments, at the release: ravop.federated.recovery)
        Grant("graph keys: progress", _graph("meta", "taken", "ran", "held", "outbox", "steps", "attempts", "t:*", "ckpt:*",
                                             "segs:*", "traces:*", "clients", "partials", "public_keys",
                                             "shares", "reveals"), ("hset",)),
        # the voters' names and a dispute's narrowing recorded (votes:*), each written once: a check's state is
        # derived from the voters' own keys (ravop.store.votes), never read from here
        Grant("graph keys: voters", _graph("votes:*"), ("hsetnx",)),
        # votes (ravop.store.votes): each principal's in a key only its user may write, once (HSETNX, no HSET nor
        # DEL), so that a worker user can neither forge nor rewrite another user's vote or part of a check, nor
        # change its own after the count
        *([Grant("graph keys: its own votes", _graph(f"vote:*:{user}"), ("hsetnx",))] if user else []),
        # results sealed by the vote (ravop.store.seals): who sealed a value, and its own seals only, so that a
        # worker user adds one vote to a value's seal and cannot change another user's
        Grant("graph keys: sealers of results", _graph("sealers:*"), ("sadd",)),
        *([Grant("graph keys: its own seals of results", _graph(f"seal:*:{user}"), ("set",))] if user else []),
        # the checkpoints that name a checkpoint value shared by several loops (ckpt:v:*:refs,
        # worker/loops/shared_checkpoint.py)
        Grant("graph keys: shared checkpoint values' references", _graph("ckpt:*"), ("sadd", "srem")),
        Grant("graph keys: counters", _graph("meta", "deps", "refs"), ("hincrby",)),
        Grant("graph keys: consumed entries", _graph("outbox", "refs", "segs:*"), ("hdel",)),
        Grant("graph keys: finished subgraphs", _graph("done"), ("sadd",)),
        Grant("graph keys: end events and settled disputes", _graph("events", "disputes"), ("xadd",)),
        # (XREADGROUP makes its consumer, XCLAIM reclaims: no XAUTOCLAIM or XGROUP CREATECONSUMER is sent)
        Grant("work streams", streams,
              ("xreadgroup", "xack", "xdel", "xadd", "xclaim", "xpending", "xlen", "xrange", "xinfo|stream",
               "xinfo|groups", "xgroup|create", "xgroup|delconsumer", "type")),
        Grant("dead letters", (DEAD_LETTER,), ("xadd", "type")),   # TYPE: a damaged stream is found and logged
        Grant("starting marks", (STARTING,), ("zadd", "zrem", "zrangebyscore")),
        # liveness: each command on the keys of its type only, so that no key is retyped (a string where
        # requesters read a set would break their status)
        Grant("worker registry: read", _registry(), _READ_STRING + _READ_SET + ("hgetall", "hget", "hmget")),
        Grant("worker registry: liveness", (worker_key(ANY), provider_key(ANY)), ("set", "del")),
        Grant("worker registry: sets", (workers_set(ANY), PROVIDERS), ("sadd", "srem")),
        Grant("worker registry: advertisements", (info_key(ANY),), ("del", "hset", "pexpire")),
        # read only (issue 44): a token's bans are written by its requester on the votes' evidence
        # (ravop.client.bans), never by a worker user, whose raw SADD would stop all of a token's graphs
        Grant("banned sets", (banned_pattern(),), ("sismember", "smembers")),
        # verify='spot': a token's record of each worker's checked results, kept by the SPOT script
        Grant("trust records", (trust_pattern(),), _READ_HASH + ("hset", "hincrby")),
        Grant("token registry", (TOKENS,), ("smembers",)),
        # quotas (ravop.store.quotas): read; a token's usage (worker time, subgraphs running) kept as workers run
        # its work; sizes of a token's keys, checked against its memory quota before outputs are stored
        Grant("quotas", (quota_key(ANY),), _READ_HASH),
        Grant("usage", (usage_key(ANY),), _READ_HASH + ("hset", "hdel", "hincrbyfloat")),
        Grant("token keys: sizes", (token_prefix(ANY) + ANY,), ("memory|usage",)),
        Grant("inboxes", (inbox_pattern(),), ("zrange", "zrem")),
        Grant("federated open", (FEDERATED_OPEN,), ("smembers", "sadd", "srem")),
        # The scripts name graph keys, the work streams and the dead letters; each command inside is checked
        # against the grants above.
        Grant("scripts", _graph(ANY) + streams + (DEAD_LETTER, trust_pattern())
              + ((principal_key(user),) if user else ()), ("eval", "evalsha")),
    ]


def grants_of(role: str, namespace: str = "") -> Tuple[Tuple[str, ...], List[Grant]]:
    """(keyless commands, grants) of `role`."""
    if role == REQUESTER:
        return REQUESTER_KEYLESS, requester_grants(namespace)
    if role == WORKER:
        return WORKER_KEYLESS, worker_grants(namespace)
    raise ValueError(f"role must be {REQUESTER!r} or {WORKER!r}, not {role!r}")


def _rules(keyless: Sequence[str], grants: Sequence[Grant]) -> List[str]:
    selectors = ["(" + " ".join([*(f"+{c}" for c in g.commands), *(f"~{p}" for p in g.patterns)]) + ")"
                 for g in grants]
    return ["resetkeys", "resetchannels", *(f"&{c}" for c in CHANNELS), "-@all", *(f"+{c}" for c in keyless),
            *selectors]


def requester_rules(namespace: str) -> List[str]:
    """ACL SETUSER arguments (after the name) that confine a requester to token `namespace`."""
    return _rules(*grants_of(REQUESTER, namespace))


def worker_rules(user: str) -> List[str]:
    """ACL SETUSER arguments (after the name) of worker user `user`."""
    return _rules(*grants_of(WORKER, user))


def allows(role: str, command: str, key: Optional[str], namespace: str = "") -> bool:
    """Whether `role` may send `command` (lower case, `container|sub`) naming `key` (None: a keyless command),
    by the tables above: what the server must enforce (tests/security/test_acl.py)."""
    keyless, grants = grants_of(role, namespace)
    container = command.split("|", 1)[0]
    if key is None:
        return command in keyless or container in keyless
    return any((command in g.commands or container in g.commands) and
               any(fnmatchcase(key, p) for p in g.patterns) for g in grants)


def kind_of(name: str, user: Mapping[str, Any]) -> Optional[str]:
    """'token', 'worker' or None (any other user) from redis-py's `acl_getuser(name)`, by the keys granted."""
    granted = repr(user)
    if f"~{queue(ANY)}" in granted:
        return "worker"
    if f"~{token_pattern(name)}" in granted:
        return "token"
    return None
