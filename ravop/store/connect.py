"""Reaching the server: fail fast and clearly when it is not there, ride out a blip once it is, and keep
trying (saying so) through a longer outage such as a restart.

Credentials and TLS come with the URL: `redis://USER:SECRET@host:6379/0` (what `ravop admin ... create`
prints), `rediss://...` for TLS, with redis-py's options as query parameters
(`?ssl_ca_certs=/path/ca.pem` for a private CA, `ssl_certfile`/`ssl_keyfile` for a client certificate).

The same URL names a standalone server or any node of a Redis/Valkey Cluster: a node that says
`cluster_enabled:1` (INFO cluster) gets redis-py's `RedisCluster` client, which finds the other nodes and sends
each command to the shard of its keys (the key schema keeps each graph in one slot: ravop.store.keys).
"""
import time
from typing import Callable, List, Optional
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from ..core.errors import ConnectionFailed
from .client_types import Client
from .command_packer import CommandPacker
from .keys import DEVICE_KINDS, GROUP, queue

CONNECT_TIMEOUT = 5.0
SOCKET_TIMEOUT = 60.0  # longer than any blocking read we issue (at most a few seconds)
# Small commands packed by hiredis, large values sent from their own memory (ravop.store.command_packer).
_PACKER = CommandPacker()


def _short_handshake() -> dict:
    """Options that leave out what redis-py adds to every new connection after HELLO: CLIENT SETINFO of its name
    and version (2 round trips, for CLIENT LIST's display) and, on RESP3, CLIENT MAINT_NOTIFICATIONS (1 round
    trip, for a managed cloud's maintenance events). A worker 50 ms from the store opens connections as its
    threads need them (a loop's writes, its exchange's sends and reads): 0.15 s less each."""
    try:
        import redis.driver_info   # noqa: F401 - redis-py 7+ names the library with it (None: not at all)
        options: dict = {"driver_info": None}
    except ImportError:
        options = {"lib_name": None, "lib_version": None}
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:   # a redis-py without them
        return options
    return {**options, "maint_notifications_config": MaintNotificationsConfig(enabled=False)}


_SECRET_PARAMETERS = ("pass", "secret", "token", "key")   # ?password=, ?ssl_password=, ?ssl_keyfile_password=...


def redact(url: str) -> str:
    """The URL without its password, in the user part or in a query parameter (`?password=`), for messages."""
    base, mark, rest = url.partition("?")
    try:
        parts = urlsplit(base)
        password = parts.password
    except ValueError:   # not a URL urllib can split: show nothing of it that could be a secret
        return "<an unreadable URL>"
    if password is not None:
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
        base = base.replace(parts.netloc, netloc, 1)
    query, hash_mark, fragment = rest.partition("#")
    hidden = [(name, "***" if any(word in name.lower() for word in _SECRET_PARAMETERS) else value)
              for name, value in parse_qsl(query, keep_blank_values=True)]
    return base + mark + urlencode(hidden, safe="*/:") + hash_mark + fragment


def url_user(url: str) -> Optional[str]:
    """The user named in `url`'s credentials, unless it is the server's `default` user: with `ravop admin`
    users it is also the token, so R.initialize(redis_url=URL) needs nothing else."""
    user = urlsplit(url).username
    return unquote(user) if user and unquote(user) != "default" else None


def client_user(client: Client) -> Optional[str]:
    """The ACL user `client` connects as, unless it is the server's `default` user (None then)."""
    pool_kwargs = (client.nodes_manager.connection_kwargs if isinstance(client, RedisCluster)
                   else client.connection_pool.connection_kwargs)
    user = pool_kwargs.get("username")
    return user if user and user != "default" else None


def connect(url: str, timeout: float = CONNECT_TIMEOUT, socket_timeout: float = SOCKET_TIMEOUT) -> Client:
    """A client for `url` (redis://, rediss://, unix://) after a successful PING: a `RedisCluster` if the
    server is a cluster node; `ConnectionFailed` naming the URL within about `timeout` seconds otherwise."""
    try:
        # No retries for the first PING: redis-py's default (10 retries with backoff) turns an unreachable
        # server into a minute-long hang. Its reply is awaited `timeout` s too, not the socket timeout: a server
        # that accepts the connection but never answers (a stopped process, the wrong port) fails as promised.
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout,
                                      retry=Retry(NoBackoff(), 0), health_check_interval=30,
                                      command_packer=_PACKER, **_short_handshake())
    except ValueError as exc:
        raise ConnectionFailed(f"invalid Redis URL {redact(url)!r}: {exc}") from None
    try:
        client.ping()
        in_cluster = client.info("cluster").get("cluster_enabled") == 1
    except redis.AuthenticationError as exc:
        client.close()
        raise ConnectionFailed(f"Redis at {redact(url)} refused the credentials (a wrong password, or the user was "
                               f"revoked): {exc}") from None
    except (redis.RedisError, OSError) as exc:
        client.close()
        raise ConnectionFailed(f"cannot reach Redis at {redact(url)}: {exc}") from None
    _set_socket_timeout(client, socket_timeout)
    if in_cluster:
        client.close()
        return _cluster_client(url, timeout, socket_timeout)
    client.set_retry(_RETRY)
    return client


_RETRY = Retry(ExponentialBackoff(cap=1.0, base=0.05), 3)


def _set_socket_timeout(client: redis.Redis, seconds: float) -> None:
    """The socket timeout of every connection of `client` from now on, the open ones included."""
    pool = client.connection_pool
    pool.connection_kwargs["socket_timeout"] = seconds
    for connection in [*pool._available_connections, *pool._in_use_connections]:
        connection.socket_timeout = seconds
        if connection._sock is not None:
            connection._sock.settimeout(seconds)


def _cluster_client(url: str, timeout: float, socket_timeout: float) -> RedisCluster:
    try:
        client = RedisCluster.from_url(url, socket_connect_timeout=timeout, socket_timeout=socket_timeout,
                                       retry=_RETRY)
    except (redis.RedisError, RedisClusterException, OSError) as exc:
        raise ConnectionFailed(f"cannot reach the Redis Cluster of {redact(url)}: {exc}") from None
    # The packer for the connections to every node, known and found later (RedisCluster does not
    # pass it on itself).
    client.nodes_manager.connection_kwargs["command_packer"] = _PACKER
    for node in client.get_nodes():
        node.redis_connection.connection_pool.connection_kwargs["command_packer"] = _PACKER
    return client


def node_client(client: Client, key: Optional[str] = None) -> redis.Redis:
    """The client of the server that holds `key` (of any node without one): `client` itself unless it is a
    cluster's. For what must go to one server: INFO and CONFIG, and tensor reads straight from a socket."""
    if not isinstance(client, RedisCluster):
        return client
    node = client.get_default_node() if key is None else client.get_node_from_key(key)
    return client.get_redis_connection(node)


def ensure_queues(client: Client) -> List[str]:
    """Create each device stream and its consumer group (idempotent; also after a server lost its data).
    Returns the streams whose group was made now. A stream damaged by someone (another type in its place) is
    left to ravop.store.repair, which a worker or an admin runs."""
    made = []
    for kind in DEVICE_KINDS:
        try:
            client.xgroup_create(queue(kind), GROUP, id="0", mkstream=True)
            made.append(queue(kind))
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc) and "WRONGTYPE" not in str(exc):
                raise
    return made


class Outage:
    """A loop's view of a lost server: how long to wait before trying again (doubling from `first` to
    `cap` seconds) and one line through `say` when the server is lost and when it answers again."""

    def __init__(self, say: Callable[[str], None], first: float = 0.1, cap: float = 5.0) -> None:
        self.say, self.first, self.cap = say, first, cap
        self.since: Optional[float] = None
        self.delay = first

    def lost(self, exc: BaseException) -> float:
        """Seconds to wait before the next try."""
        if self.since is None:
            self.since = time.monotonic()
            self.say(f"lost the connection to Redis ({exc}); reconnecting with backoff")
        delay, self.delay = self.delay, min(self.delay * 2, self.cap)
        return delay

    def seconds(self) -> float:
        """How long the server has been unreachable (0 while it answers)."""
        return 0.0 if self.since is None else time.monotonic() - self.since

    def ok(self) -> bool:
        """The server answered; True if it had been lost (and says so)."""
        if self.since is None:
            return False
        self.say(f"reconnected to Redis after {self.seconds():.1f} s")
        self.since, self.delay = None, self.first
        return True
