"""The stored values of a graph's persist rules (`ravop.core.persist_rules`: the losses of a fit, named by rule),
read as far as they are stored: a loop writes its steps' values in step order (a resumed one rewrites from its
checkpoint on), so a rule's stored values are a prefix of its runs, and a read costs what the loop has run, not
the 10**6 epochs a fit was recorded for. A Lua function the reading scripts share (`WALK_RULES`), the decoding of
its reply, and the same walk without a script."""
from collections.abc import Callable, Sequence
from typing import Any, Dict, List, Tuple

from ..core.persist_rules import PersistRule
from .client_types import Client
from .keys import GraphKeys

Walked = Sequence[Tuple[PersistRule, List[bytes]]]   # (rule, the stored values of its first runs), per rule

# walk(rules key, tensor key prefix, wanted(template), largest value in bytes or 0, out): appends, per rule whose
# template is wanted, the rule's text, n, and the values of its first n runs (up to the first not stored, or
# larger than the limit).
WALK_RULES = """
local function walk(rules_key, tensor_prefix, wanted, limit, out)
  for _, rule in ipairs(redis.call('HVALS', rules_key)) do
    local first, epochs, batches, template = string.match(rule, '^(%d+) %d+ (%d+) %d+ (%d+) (.*)$')
    if first and wanted(template) then
      out[#out + 1] = rule
      local count_at = #out + 1
      out[count_at] = 0
      for k = 0, tonumber(epochs) * tonumber(batches) - 1 do
        local key = tensor_prefix .. string.format('%d', tonumber(first) + k)
        if limit > 0 then
          local size = redis.call('STRLEN', key)
          if size == 0 or size > limit then break end
        end
        local value = redis.call('GET', key)
        if not value then break end
        out[#out + 1] = value
        out[count_at] = out[count_at] + 1
      end
    end
  end
end
"""


def decode_walk(reply: Sequence[Any], at: int) -> Walked:
    """(rule, the values of its first runs) of the rules' part of a reply, from position `at` on (what `walk`
    appended)."""
    walked: List[Tuple[PersistRule, List[bytes]]] = []
    while at < len(reply):
        count = int(reply[at + 1])
        walked.append((PersistRule.decode(reply[at]), list(reply[at + 2:at + 2 + count])))
        at += 2 + count
    return walked


def named(walked: Walked) -> Dict[str, bytes]:
    """{persist name: value} of what `decode_walk` returned."""
    return {name: value for rule, values in walked for name, value in zip(rule.names[:len(values)], values)}


def walk_unscripted(client: Client, keys: GraphKeys, wanted: Callable[[str], bool], limit: int = 0) -> List[Any]:
    """What `walk` appends, in round trips of doubling size, without a script."""
    out: List[Any] = []
    for data in client.hvals(keys.persist_rules):
        rule = PersistRule.decode(data)
        if not wanted(rule.names.template):
            continue
        values: List[bytes] = []
        size, runs = 64, len(rule.names)
        while len(values) < runs:
            ids = range(rule.first_id + len(values), rule.first_id + min(runs, len(values) + size))
            got = client.mget([keys.tensor(i) for i in ids])
            stored = next((n for n, v in enumerate(got) if v is None or (limit and len(v) > limit)), len(got))
            values += got[:stored]
            if stored < len(got):
                break
            size *= 2
        out += [data, len(values), *values]
    return out
