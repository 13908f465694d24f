"""Every persisted training and validation loss of a graph in one round trip: a Lua script walks the graph's
persist names and returns the stored value of each loss (nothing where it is not computed yet), so a
dashboard polling a training run or a History reading 10,000 batch losses costs one request, not one per
loss."""
from typing import Dict, List, Optional, Tuple

from redis import Redis

from ..core.loss_names import TRAINING_PREFIX, VALIDATION_PREFIX
from .keys import GraphKeys
from .unscripted import scripted_or_not

# KEYS: meta, persist.  ARGV: tensor key prefix, training loss prefix, validation loss prefix.
# Returns {} for a graph that is gone, else {state, name, value or false, name, value or false, ...}.
READ_LOSSES = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {} end
local out = {state}
local persist = redis.call('HGETALL', KEYS[2])
for i = 1, #persist, 2 do
  local name = persist[i]
  if string.sub(name, 1, #ARGV[2]) == ARGV[2] or string.sub(name, 1, #ARGV[3]) == ARGV[3] then
    out[#out + 1] = name
    out[#out + 1] = redis.call('GET', ARGV[1] .. persist[i + 1])
  end
end
return out
"""


def read_losses(client: Redis, keys: GraphKeys) -> Tuple[Optional[str], Dict[str, Optional[bytes]]]:
    """(state, {persist name: encoded tensor or None}) of the graph's loss values; (None, {}) if it is gone."""
    reply = scripted_or_not(client, lambda: client.register_script(READ_LOSSES)(
        keys=[keys.meta, keys.persist], args=[keys.tensor_prefix, TRAINING_PREFIX, VALIDATION_PREFIX]),
        lambda: _read_losses_unscripted(client, keys))
    if not reply:
        return None, {}
    return reply[0].decode(), {reply[i].decode(): reply[i + 1] for i in range(1, len(reply), 2)}


def _read_losses_unscripted(client: Redis, keys: GraphKeys) -> List[Optional[bytes]]:
    """READ_LOSSES's reply in two round trips, without a script."""
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.meta, "state")
    pipe.hgetall(keys.persist)
    state, persist = pipe.execute()
    if state is None:
        return []
    losses = [name for name in persist if name.decode().startswith((TRAINING_PREFIX, VALIDATION_PREFIX))]
    for name in losses:
        pipe.get(keys.tensor_prefix + persist[name].decode())
    return [state, *(x for name, value in zip(losses, pipe.execute()) for x in (name, value))]
