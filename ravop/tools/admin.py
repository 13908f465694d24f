"""`ravop admin`: the Redis users of requesters (tokens) and workers on a shared server, each confined by the
ACL rules of `ravop.store.access`. Creating one returns its connection URL; only a digest of its secret is
given to the server, so the URL printed once is the only copy. On a cluster, users are made on every node."""
import hashlib
import secrets
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster

from ..core import graph_states
from ..core.errors import RavopError
from ..store import GraphKeys
from ..store import graphs as store_graphs
from ..store import quotas
from ..store.access import kind_of, requester_rules, worker_rules
from ..store.connect import ensure_queues, node_client
from ..store.keys import TOKENS, check_name, quota_key, usage_key
from ..store.scripts import is_cluster
from . import status

KINDS = ("token", "worker")
REVOKED = "cancelled: the token's Redis user was revoked (`ravop admin token revoke`)"


def user_url(admin_url, name, secret):
    """`admin_url` with `name` and `secret` as its credentials (scheme, host, port, db and options kept)."""
    parts = urlsplit(admin_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(name, safe='')}:{quote(secret, safe='')}@{host}"))


_NOT_ADMIN = ("the --redis URL's user may not manage users (it needs the ACL command: use the server's admin "
              "user)")


def _everywhere(client):
    """Where a user change goes: every server has its own users, so on a cluster every node (replicas too)."""
    return {"target_nodes": RedisCluster.ALL_NODES} if is_cluster(client) else {}


def _acl(client, *args, **where):
    try:
        return client.execute_command("ACL", *args, **where)
    except redis.exceptions.NoPermissionError:
        raise RavopError(_NOT_ADMIN) from None


def _user(client, name):
    """redis-py's parsed ACL GETUSER of `name`, or None."""
    try:
        return client.acl_getuser(name)
    except redis.exceptions.NoPermissionError:
        raise RavopError(_NOT_ADMIN) from None


def _persist(client):
    """Save the users where the server keeps them: its ACL file, else its config file. Returns where, or
    None if it has neither (the users then last until the server restarts)."""
    for command, where in ((("ACL", "SAVE"), "the server's ACL file"), (("CONFIG", "REWRITE"),
                                                                          "the server's config file")):
        try:
            client.execute_command(*command, **_everywhere(client))
            return where
        except redis.ResponseError:
            continue
    return None


def _check_server(client):
    """The grants are ACL selectors, which Redis 7.0 and Valkey 7.2 introduced: refuse older servers."""
    info = node_client(client).info("server")
    version = str(info.get("redis_version", "0"))
    if int(version.split(".")[0]) < 7:
        raise RavopError(f"`ravop admin` needs Redis 7.0 or Valkey 7.2 or newer (its users' grants are ACL "
                         f"selectors); this server is {info.get('server_name', 'redis')} {version}")


def create(client, admin_url, kind, name, quota=None):
    """(URL of a new user `name` of `kind`, where it was saved or None). Also (re)makes the work streams, and
    registers a token user for workers to read its inbox (ravop.store.inbox). `quota`: a token's quotas and
    weight (ravop.store.quotas field -> value), as `set_quota`."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if quota and kind != "token":
        raise ValueError(f"quotas are a token's: a {kind} user has none")
    quota = quotas.checked(quota or {})
    check_name(name, f"a {kind} name")
    if name == "default":
        raise RavopError("'default' is the server's own user: pick another name")
    _check_server(client)
    if _user(client, name) is not None:
        raise RavopError(f"a Redis user {name!r} exists already: revoke it first or pick another name")
    secret = secrets.token_urlsafe(32)
    rules = requester_rules(name) if kind == "token" else worker_rules(name)
    _acl(client, "SETUSER", name, "reset", "on", "#" + hashlib.sha256(secret.encode()).hexdigest(), *rules,
         **_everywhere(client))
    ensure_queues(client)
    if kind == "token":
        client.delete(quota_key(name), usage_key(name))   # a name used before starts afresh
        quotas.write(client, name, quota)
        client.sadd(TOKENS, name)
    return user_url(admin_url, name, secret), _persist(client)


def set_quota(client, name: str, values: dict) -> quotas.Quota:
    """Set token `name`'s quotas and weight (ravop.store.quotas field -> value; None leaves one as it is); the
    quota as it is now. Workers see a change within seconds (they cache a token's quota for a moment)."""
    user = _user(client, name)
    if user is None or kind_of(name, user) != "token":
        raise RavopError(f"there is no token user {name!r} on this server (see `ravop admin token list`)")
    return quotas.write(client, name, values)


def revoke(client, kind, name):
    """Delete user `name` (of `kind`): the server closes its connections at once, so its trackers and workers
    learn it at their next round trip (a worker's heartbeat: within a second). A token's graphs still running
    are cancelled, naming the revocation, so that no worker spends more time on them. Returns (where it was
    saved, as `create`; the ids of the graphs cancelled)."""
    user = _user(client, name)
    if user is None or kind_of(name, user) != kind:
        raise RavopError(f"there is no {kind} user {name!r} on this server (see `ravop admin {kind} list`)")
    _acl(client, "DELUSER", name, **_everywhere(client))
    cancelled = []
    if kind == "token":
        client.srem(TOKENS, name)
        for graph in store_graphs.list_graphs(client, name):
            keys = GraphKeys(name, graph["id"])
            if graph["state"] in graph_states.LIVE and status.cancel(client, keys, REVOKED, "ravop admin token revoke"):
                cancelled.append(graph["id"])
    return _persist(client), cancelled


def users(client, kind):
    """[{'name', 'enabled'}] of the users of `kind`, by name."""
    found = []
    for name in sorted(n.decode() if isinstance(n, bytes) else n for n in _acl(client, "USERS")):
        user = _user(client, name)
        if user is not None and kind_of(name, user) == kind:
            found.append({"name": name, "enabled": bool(user.get("enabled"))})
    return found
