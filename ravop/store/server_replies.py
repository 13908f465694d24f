"""Errors the server answers instead of a result, by what a client should do about them (shared by the worker
loop, worker/serve/server_errors.py, and a requester's tracker, ravop/client/tracking.py):

- 'transient': the server is busy or between states (BUSY from a long script, LOADING after a restart,
  READONLY/MASTERDOWN/CLUSTERDOWN/TRYAGAIN during a failover, MOVED/ASK storms while slots move, timeouts):
  wait and try again;
- 'damaged': a key is not what the protocol made (WRONGTYPE: a stream or hash replaced by another type; NOGROUP:
  a consumer group destroyed; NOSCRIPT: the scripts flushed): repair it (ravop.store.repair) or, for a graph's
  own keys, fail that graph naming the damage;
- 'refused': anything else (an ACL's NOPERM, an unknown error).
"""
import redis
from redis.exceptions import RedisClusterException

TRANSIENT = ("BUSY", "LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK", "NOREPLICAS")
DAMAGED = ("WRONGTYPE", "NOGROUP", "NOSCRIPT")


def kind_of(exc: BaseException) -> str:
    """'transient', 'damaged' or 'refused' for an error redis-py raised."""
    if isinstance(exc, redis.exceptions.NoScriptError):
        return "damaged"
    code = str(exc).split(" ", 1)[0].upper()
    if code in DAMAGED:
        return "damaged"
    if code in TRANSIENT or isinstance(exc, (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError,
                                             redis.ReadOnlyError, redis.exceptions.ClusterError,
                                             RedisClusterException)):
        return "transient"
    return "refused"


def first_line(exc: BaseException) -> str:
    """The error's first line, short enough for a log line."""
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
