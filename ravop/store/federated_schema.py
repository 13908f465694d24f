"""The Redis scripts and operations of federated graphs (approach='federated'): providers advertise the columns
they hold, join an open graph up to its `max_clients`, and each writes one partial per rule column; nothing else
of their data is ever written. Under `"secure": true` each joined provider also writes an X25519 public key to
the graph's `public_keys` hash (`public_keys_key`), and its partial is masked (`ravop.federated.secure`).
The key names are in `ravop.store.keys` (FEDERATED_OPEN, PROVIDERS,
provider_key, FederatedKeys). The graph's meta also holds `rules` (canonical JSON), and counts providers as its
subgraphs and ops, so that R.track_progress and R.get_my_graphs work unchanged.
"""
import json
from typing import Any, Dict, Iterable, List

from .client_types import Client, Pipeline
from .keys import FEDERATED_OPEN, PROVIDERS, FederatedKeys, GraphKeys, graph_ref, provider_key
from .scripts import _COMMON, with_states
from .workers import TTL, forget

APPROACH = "federated"  # a federated graph's meta `approach`


def open_if_federated(client: Client, keys: GraphKeys) -> None:
    """Open a started federated graph to providers (what a requester on the default user does itself, and a
    worker does for a token user, who may not write the shared set: ravop.store.inbox)."""
    if client.hget(keys.meta, "approach") == APPROACH.encode():
        client.sadd(FEDERATED_OPEN, graph_ref(keys))


def advertise(pipe: Pipeline, name: str, columns: Iterable[str], ttl: float = TTL) -> None:
    pipe.set(provider_key(name), json.dumps({"columns": list(columns)}), px=int(ttl * 1000))  # ttl may be fractional
    pipe.sadd(PROVIDERS, name)


def withdraw(pipe: Pipeline, name: str) -> None:
    pipe.delete(provider_key(name))
    pipe.srem(PROVIDERS, name)


def live_providers(client: Client) -> Dict[str, List[str]]:
    """{name: [columns]} of the providers whose advertisement has not expired (forgetting the others)."""
    names = sorted(n.decode() for n in client.smembers(PROVIDERS))
    if not names:
        return {}
    values = client.mget([provider_key(name) for name in names])
    forget(client, PROVIDERS, [name for name, value in zip(names, values) if value is None])
    return {name: json.loads(value)["columns"] for name, value in zip(names, values) if value is not None}


# KEYS: meta, clients.  ARGV: provider.
# A provider joins a running federated graph if it is not full. Returns {outcome, 1 if the graph should leave
# the open set (full, or not running)}: the caller removes it there (another slot on a cluster), so a graph
# whose provider dies in between stays listed, and the next provider's JOIN says so again.
JOIN = with_states("""
local meta = redis.call('HMGET', KEYS[1], 'state', 'max_clients')
if not meta[1] or not meta[2] then return {'gone', 1} end
if meta[1] ~= '@RUNNING@' then return {meta[1], 1} end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return {'member', 0} end
local joined = redis.call('HLEN', KEYS[2])
local wanted = tonumber(meta[2])
if joined >= wanted then return {'full', 1} end
redis.call('HSET', KEYS[2], ARGV[1], 'joined')
if joined + 1 >= wanted then return {'joined', 1} end
return {'joined', 0}
""")

# KEYS: meta, clients, partials, events.  ARGV: provider, partial JSON.
# Stores a joined provider's partial; the last one ends the graph.
CONTRIBUTE = with_states(_COMMON + """
if redis.call('HGET', KEYS[1], 'state') ~= '@RUNNING@' then return 0 end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= 'joined' then return 0 end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], 'done')
redis.call('HINCRBY', KEYS[1], 'ops_done', 1)
redis.call('HINCRBY', KEYS[1], 'done_subgraphs', 1)
if redis.call('HLEN', KEYS[3]) >= tonumber(redis.call('HGET', KEYS[1], 'max_clients')) then
  redis.call('HSET', KEYS[1], 'state', '@DONE@', 'finished', now())
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', 16, '*', 'state', '@DONE@')
end
return 1
""")


# KEYS: meta, clients, public_keys.  ARGV: provider, public key.
# A joined provider of a running graph publishes its key; returns how many keys the graph holds (0 if refused).
PUBLISH_KEY = with_states("""
if redis.call('HGET', KEYS[1], 'state') ~= '@RUNNING@' then return 0 end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= 'joined' then return 0 end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
return redis.call('HLEN', KEYS[3])
""")


def public_keys_key(keys: GraphKeys) -> str:
    """The hash of a secure graph's providers' public keys (provider -> base64 X25519 key); under the graph's
    prefix, so it goes with the graph."""
    return keys.prefix + "public_keys"


def public_keys(client: Client, keys: GraphKeys) -> Dict[str, str]:
    return {name.decode(): key.decode() for name, key in client.hgetall(public_keys_key(keys)).items()}


class FederatedScripts:
    def __init__(self, client: Client) -> None:
        self.client = client
        self._join = client.register_script(JOIN)
        self._contribute = client.register_script(CONTRIBUTE)
        self._publish_key = client.register_script(PUBLISH_KEY)

    def publish_key(self, keys: GraphKeys, provider: str, public: str) -> int:
        """How many public keys the graph holds once this provider's is in; 0 if it no longer runs or the
        provider had not joined it."""
        fed = FederatedKeys(keys)
        return self._publish_key(keys=[keys.meta, fed.clients, public_keys_key(keys)], args=[provider, public])

    def join(self, keys: GraphKeys, provider: str) -> str:
        """'joined', 'member', 'full', or the graph's state ('done', 'failed', 'gone', ...)."""
        outcome, close = self._join(keys=[keys.meta, FederatedKeys(keys).clients], args=[provider])
        if close:
            self.client.srem(FEDERATED_OPEN, graph_ref(keys))
        return outcome.decode()

    def contribute(self, keys: GraphKeys, provider: str, partials: Dict[str, Any]) -> int:
        """1 if stored, 0 if the graph no longer runs or this provider had not joined it. `partials`: {column:
        partial}, or a secure provider's {"withheld": {column: k}, "k": k, "secure": its masked sums}."""
        fed = FederatedKeys(keys)
        return self._contribute(keys=[keys.meta, fed.clients, fed.partials, keys.events],
                                args=[provider, json.dumps(partials)])
