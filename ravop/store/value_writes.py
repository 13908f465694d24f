"""A loop's persisted values (its losses) written in one command per flush: a loop persists one or two values a
step, and a SET per value cost a digits fit's last flush 1-1.3 ms of client-side command packing for 170 losses
(a script taking them all: 0.3-0.5 ms). Queued on the loop's write transaction (worker/loops/loop_subgraph.py), so the
values still land with the progress and checkpoint written beside them. EVAL, not EVALSHA: a server that
restarted and lost its script cache would refuse an EVALSHA inside the transaction, and its other writes (a
checkpoint) would land without the values."""
from typing import Any, Sequence

# KEYS: the values' tensor keys (one graph's: one hash slot).  ARGV: '1' to set only keys that do not exist yet
# (SET NX: a value written before a worker died is never written again) or '0', then the values.
# Returns 1 per key set, 0 per key left as it was.
SET_VALUES = """
local only_new = ARGV[1] == '1'
local set = {}
for i = 1, #KEYS do
  local done
  if only_new then
    done = redis.call('SET', KEYS[i], ARGV[i + 1], 'NX')
  else
    done = redis.call('SET', KEYS[i], ARGV[i + 1])
  end
  set[i] = done and 1 or 0
end
return set
"""
# Keys per command: bounds how long one script holds the server (a flush of a very fast loop's values).
BATCH = 4096


def queue_values(pipe: Any, keys: Sequence[str], values: Sequence[bytes], only_new: bool) -> int:
    """Queue SETs of `values` under `keys` on `pipe` (a transaction); the number of commands queued, whose replies
    are lists of 1 (set) or 0 (kept) per key."""
    commands = 0
    for at in range(0, len(keys), BATCH):
        part = keys[at:at + BATCH]
        pipe.execute_command("EVAL", SET_VALUES, len(part), *part, "1" if only_new else "0", *values[at:at + BATCH])
        commands += 1
    return commands
