"""Every small persisted value of a finished graph in one round trip: a Lua script returns nothing but the
state while the graph is not done, and once it is, walks the persist names and returns each stored value of
at most `max_bytes` (a loss, a metric, a small weight), and those of its persist rules as far as they are stored
(`ravop.store.rule_values`), so that fetching a training run's losses one name at a time, as the RavDL guide writes
it, costs one request for all of them (`ravop.client.stored_values.DoneValues`)."""
from typing import Dict, List, Optional, Tuple

from ..core.graph_states import DONE
from .client_types import Client
from .keys import GraphKeys
from .rule_values import WALK_RULES, decode_walk, named, walk_unscripted
from .unscripted import scripted_or_not

# KEYS: meta, persist, persist rules.  ARGV: tensor key prefix, largest value in bytes, the done state.
# Returns {} for a graph that is gone, {state} for one not done, else {state, n, then n (name, value) pairs, then
# the rules' walk}.
READ_SMALL = WALK_RULES + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {} end
if state ~= ARGV[3] then return {state} end
local out = {state, 0}
local limit = tonumber(ARGV[2])
local persist = redis.call('HGETALL', KEYS[2])
for i = 1, #persist, 2 do
  local key = ARGV[1] .. persist[i + 1]
  local size = redis.call('STRLEN', key)
  if size > 0 and size <= limit then
    out[#out + 1] = persist[i]
    out[#out + 1] = redis.call('GET', key)
    out[2] = out[2] + 1
  end
end
walk(KEYS[3], ARGV[1], function(template) return true end, limit, out)
return out
"""


def read_small_values(client: Client, keys: GraphKeys,
                      max_bytes: int) -> Tuple[Optional[str], Dict[str, bytes]]:
    """(state, {persist name: stored bytes}) of the graph's persisted values of at most `max_bytes`, read only
    once it is done (else {}); (None, {}) if the graph is gone."""
    reply = scripted_or_not(client, lambda: client.register_script(READ_SMALL)(
        keys=[keys.meta, keys.persist, keys.persist_rules], args=[keys.tensor_prefix, max_bytes, DONE]),
        lambda: _read_small_unscripted(client, keys, max_bytes))
    if len(reply) < 2:
        return (reply[0].decode() if reply else None), {}
    listed = 2 + 2 * int(reply[1])
    values = {reply[i].decode(): reply[i + 1] for i in range(2, listed, 2)}
    return reply[0].decode(), {**values, **named(decode_walk(reply, listed))}


def _read_small_unscripted(client: Client, keys: GraphKeys, max_bytes: int) -> List[bytes]:
    """READ_SMALL's reply in three round trips (and the rules' in `walk_unscripted`), without a script."""
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.meta, "state")
    pipe.hgetall(keys.persist)
    state, persist = pipe.execute()
    if state is None or state != DONE.encode():
        return [state] if state is not None else []
    names = list(persist)
    for name in names:
        pipe.strlen(keys.tensor_prefix + persist[name].decode())
    small = [name for name, size in zip(names, pipe.execute()) if 0 < size <= max_bytes]
    for name in small:
        pipe.get(keys.tensor_prefix + persist[name].decode())
    pairs = [x for name, value in zip(small, pipe.execute()) for x in (name, value)]
    return [state, len(small), *pairs, *walk_unscripted(client, keys, lambda template: True, max_bytes)]
