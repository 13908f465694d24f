"""Every persisted training and validation loss of a graph in one round trip: a Lua script walks the graph's
persist names and returns the stored value of each loss (nothing where it is not computed yet), and the values
of its loss rules as far as they are stored (`ravop.store.rule_values`), so a dashboard polling a training run
or a History reading 10,000 batch losses costs one request, not one per loss, and a fit recorded for 10**6
epochs that stopped after 2 is read in the time of 2."""
from typing import Dict, List, Optional, Tuple

from redis import Redis

from ..core.loss_names import TRAINING_PREFIX, VALIDATION_PREFIX
from .keys import GraphKeys
from .rule_values import WALK_RULES, Walked, decode_walk, walk_unscripted
from .unscripted import scripted_or_not

# KEYS: meta, persist, persist rules.  ARGV: tensor key prefix, training loss prefix, validation loss prefix.
# Returns {} for a graph that is gone, else {state, n, then n (name, value or false) pairs, then the rules' walk}.
READ_LOSSES = WALK_RULES + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {} end
local function is_loss(name)
  return string.sub(name, 1, #ARGV[2]) == ARGV[2] or string.sub(name, 1, #ARGV[3]) == ARGV[3]
end
local out = {state, 0}
local persist = redis.call('HGETALL', KEYS[2])
for i = 1, #persist, 2 do
  local name = persist[i]
  if is_loss(name) then
    out[#out + 1] = name
    out[#out + 1] = redis.call('GET', ARGV[1] .. persist[i + 1])
    out[2] = out[2] + 1
  end
end
walk(KEYS[3], ARGV[1], is_loss, 0, out)
return out
"""


def _is_loss(name: str) -> bool:
    return name.startswith((TRAINING_PREFIX, VALIDATION_PREFIX))


def read_losses(client: Redis, keys: GraphKeys) -> Tuple[Optional[str], Dict[str, Optional[bytes]], Walked]:
    """(state, {persist name given one by one: encoded tensor or None where not computed}, [(loss rule, the
    encoded values of its first runs, as far as they are stored)]) of the graph's losses; (None, {}, []) if it is
    gone."""
    reply = scripted_or_not(client, lambda: client.register_script(READ_LOSSES)(
        keys=[keys.meta, keys.persist, keys.persist_rules],
        args=[keys.tensor_prefix, TRAINING_PREFIX, VALIDATION_PREFIX]),
        lambda: _read_losses_unscripted(client, keys))
    if not reply:
        return None, {}, []
    listed = 2 + 2 * int(reply[1])
    values = {reply[i].decode(): reply[i + 1] for i in range(2, listed, 2)}
    return reply[0].decode(), values, decode_walk(reply, listed)


def _read_losses_unscripted(client: Redis, keys: GraphKeys) -> List[Optional[bytes]]:
    """READ_LOSSES's reply without a script (two round trips, and the rules' in `walk_unscripted`)."""
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.meta, "state")
    pipe.hgetall(keys.persist)
    state, persist = pipe.execute()
    if state is None:
        return []
    losses = [name for name in persist if _is_loss(name.decode())]
    for name in losses:
        pipe.get(keys.tensor_prefix + persist[name].decode())
    pairs = [x for name, value in zip(losses, pipe.execute()) for x in (name, value)]
    return [state, len(losses), *pairs, *walk_unscripted(client, keys, _is_loss)]
