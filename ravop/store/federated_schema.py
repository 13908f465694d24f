"""The Redis scripts and operations of federated graphs (approach='federated'): providers advertise the columns
they hold, join an open graph up to its `max_clients`, and each writes one partial per rule column; nothing else
of their data is ever written. Under `"secure": true` each joined provider also writes an X25519 public key to
the graph's `public_keys` hash (`public_keys_key`), its encrypted Shamir shares to the others to `shares`, its
masked partial, and, once the inputs close, its revealed shares to `reveals` (`ravop.federated.recovery`).
The key names are in `ravop.store.keys` (FEDERATED_OPEN, PROVIDERS,
provider_key, FederatedKeys). The graph's meta also holds `rules` (canonical JSON), and counts providers as its
subgraphs and ops, so that R.track_progress and R.get_my_graphs work unchanged.
"""
import json
from typing import Any, Dict, Iterable, List, Tuple

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

# KEYS: meta, clients, partials, events.  ARGV: provider, partial JSON, 1 if the graph is secure.
# Stores a joined provider's partial; the last one ends the graph, or, if it is secure, closes its inputs (the
# reveals end it). A secure graph whose inputs closed takes no more (a provider declared dropped that was slow).
CONTRIBUTE = with_states(_COMMON + """
if redis.call('HGET', KEYS[1], 'state') ~= '@RUNNING@' then return 0 end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= 'joined' then return 0 end
if redis.call('HEXISTS', KEYS[1], 'inputs_closed') == 1 then return 0 end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], 'done')
redis.call('HINCRBY', KEYS[1], 'ops_done', 1)
redis.call('HINCRBY', KEYS[1], 'done_subgraphs', 1)
if redis.call('HLEN', KEYS[3]) >= tonumber(redis.call('HGET', KEYS[1], 'max_clients')) then
  if ARGV[3] == '1' then
    redis.call('HSET', KEYS[1], 'inputs_closed', 1)
  else
    redis.call('HSET', KEYS[1], 'state', '@DONE@', 'finished', now())
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', 16, '*', 'state', '@DONE@')
  end
end
return 1
""")

# KEYS: meta, clients, partials.  ARGV: threshold t, the providers dropped (joined, sent no partial, gone).
# Closes a secure graph's inputs without them, if at least t partials are in: {'closed' or 'short' (fewer than t)
# or 'ended' or 'stale' (one of them sent its partial meanwhile), the number of partials}.
CLOSE_INPUTS = with_states("""
if redis.call('HGET', KEYS[1], 'state') ~= '@RUNNING@' then return {'ended', 0} end
local inputs = redis.call('HLEN', KEYS[3])
if redis.call('HEXISTS', KEYS[1], 'inputs_closed') == 1 then return {'closed', inputs} end
for i = 2, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) ~= 'joined' then return {'stale', inputs} end
end
if inputs < tonumber(ARGV[1]) then return {'short', inputs} end
for i = 2, #ARGV do redis.call('HSET', KEYS[2], ARGV[i], 'dropped') end
redis.call('HSET', KEYS[1], 'inputs_closed', 1)
return {'closed', inputs}
""")

# KEYS: meta, clients, reveals, events.  ARGV: provider, its revealed shares (JSON), threshold t.
# A survivor of a secure graph whose inputs closed reveals its shares, once; the t-th reveal ends the graph (t
# shares rebuild each secret, so survivors that stop before revealing do not hold the release up).
REVEAL = with_states(_COMMON + """
if redis.call('HGET', KEYS[1], 'state') ~= '@RUNNING@' then return 0 end
if redis.call('HEXISTS', KEYS[1], 'inputs_closed') ~= 1 then return 0 end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= 'done' then return 0 end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], 'revealed')
if redis.call('HLEN', KEYS[3]) >= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'state', '@DONE@', 'finished', now())
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', 16, '*', 'state', '@DONE@')
end
return 1
""")


# KEYS: meta, clients, and public_keys or shares.  ARGV: provider, its public key or its encrypted shares (JSON).
# A joined provider of a running graph publishes its key, or (secure graphs) sends its shares; returns how many
# providers have (0 if refused).
JOINED_PROVIDER_WRITES = with_states("""
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


def shares_key(keys: GraphKeys) -> str:
    """The hash of a secure graph's encrypted shares: sender -> {recipient: ciphertext} (JSON)."""
    return keys.prefix + "shares"


def reveals_key(keys: GraphKeys) -> str:
    """The hash of a secure graph's revealed shares: survivor -> its reveal (JSON, `ravop.federated.recovery`)."""
    return keys.prefix + "reveals"


class FederatedScripts:
    def __init__(self, client: Client) -> None:
        self.client = client
        self._join = client.register_script(JOIN)
        self._contribute = client.register_script(CONTRIBUTE)
        self._joined_provider_writes = client.register_script(JOINED_PROVIDER_WRITES)
        self._close_inputs = client.register_script(CLOSE_INPUTS)
        self._reveal = client.register_script(REVEAL)

    def publish_key(self, keys: GraphKeys, provider: str, public: str) -> int:
        """How many public keys the graph holds once this provider's is in; 0 if it no longer runs or the
        provider had not joined it."""
        fed = FederatedKeys(keys)
        return self._joined_provider_writes(keys=[keys.meta, fed.clients, public_keys_key(keys)],
                                           args=[provider, public])

    def join(self, keys: GraphKeys, provider: str) -> str:
        """'joined', 'member', 'full', or the graph's state ('done', 'failed', 'gone', ...)."""
        outcome, close = self._join(keys=[keys.meta, FederatedKeys(keys).clients], args=[provider])
        if close:
            self.client.srem(FEDERATED_OPEN, graph_ref(keys))
        return outcome.decode()

    def contribute(self, keys: GraphKeys, provider: str, partials: Dict[str, Any], secure: bool = False) -> int:
        """1 if stored, 0 if the graph no longer runs, this provider had not joined it or (secure) its inputs
        closed. `partials`: {column: partial}, or a secure provider's {"withheld": {column: k}, "k": k, "secure":
        its masked sums, ...}."""
        fed = FederatedKeys(keys)
        return self._contribute(keys=[keys.meta, fed.clients, fed.partials, keys.events],
                                args=[provider, json.dumps(partials), int(secure)])

    def share(self, keys: GraphKeys, provider: str, shares: Dict[str, str]) -> int:
        """How many providers have sent their shares once this one's are in; 0 if refused."""
        return self._joined_provider_writes(keys=[keys.meta, FederatedKeys(keys).clients, shares_key(keys)],
                                           args=[provider, json.dumps(shares)])

    def close_inputs(self, keys: GraphKeys, threshold: int, dropped: List[str]) -> Tuple[str, int]:
        """Close a secure graph's inputs without the `dropped` providers: ('closed', partials in), or 'short',
        'ended' or 'stale' (see CLOSE_INPUTS)."""
        fed = FederatedKeys(keys)
        outcome, inputs = self._close_inputs(keys=[keys.meta, fed.clients, fed.partials], args=[threshold, *dropped])
        return outcome.decode(), int(inputs)

    def reveal(self, keys: GraphKeys, provider: str, revealed: Dict[str, Dict[str, str]], threshold: int) -> int:
        """1 if stored (the `threshold`-th ends the graph), 0 if refused."""
        return self._reveal(keys=[keys.meta, FederatedKeys(keys).clients, reveals_key(keys), keys.events],
                            args=[provider, json.dumps(revealed), threshold])
