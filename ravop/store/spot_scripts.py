"""The server-side half of adaptive spot checks (`R.Graph(verify='spot')`, ravop/core/spot_policy.py): one Lua script
that takes a worker's digest of a result (a plain subgraph's outputs, or a loop segment's carried values), draws
whether it is checked, counts the re-runs' digests, settles disputes by majority and keeps the workers' trust.
Everything is decided here, atomically, after the worker has handed its digest in: the worker learns whether its
result is checked only from the reply.

Replies (first element):
- unchecked: nobody re-runs it; the worker stores its result and completes.
- hold:      checked (or still disputed): the worker acks and goes; re-runs were enqueued.
- confirmed: this run settles the check, and agrees with the majority: it stores the result and completes;
             the rest of the reply names the workers it outvoted (trust reset; kept from the graph's work by its
             meta's `outvoted`, and banned from the token's by its requester on these votes when the graph
             ends, ravop.client.bans: a worker user may not write a banned set).
- complete:  a retry of an accepted result with the same digest (its first runner died before completing).
- again:     this worker voted on it already: ack, nothing to do.
- split:     no majority after `copies + 2` runs, or a dispute with no majority by its deadline; the rest names
             the principals: the graph fails.
- unverified: (a deadline check only) no other principal checked it by the deadline: the runner's result is
             accepted as it is; the rest says why.

Votes are per principal (a worker's ACL user, ravop.core.spot_policy.principal_of): a user's second run of the same
result is answered `again`, and losers are banned by principal (by the
token's requester, ravop.client.bans). Trust is kept per principal and numerics class.
A digest of '' asks for the deadline check: a check still open `settle_seconds` after it began (or after its
dispute began) ends there, unverified (nobody disagreed) or split (a dispute nobody broke).

Trust lives in the token's `trust` hash, so a standalone server is needed (on a cluster it is in another slot than
the graph's keys; `R.activate` refuses verify='spot' there).
"""
from typing import List, Optional, Union

from .client_types import Client
from .keys import GraphKeys, TokenKeys, principal_key, queue

# KEYS: meta, votes, trust, the submitting worker's work stream, its principal's key (keys.principal_key:
# the ACL lets a worker user name only its own); for a loop segment also the loop's segments, checkpoint and taken
# hashes.
# ARGV: principal, digest ('' for the deadline check), token, graph id, subgraph id, segment ('' for a plain
# subgraph), the worker's numerics class, the prefix of the principals' own vote keys (GraphKeys.vote: each a hash
# of d (digest) and c (class) that only its user may write, once; the votes hash holds the voters' names and the
# check's state, ravop.store.votes).
# A segment is "start-end:runner" (worker/verify/spot_loop.py). Its state is mirrored in the loop's segments hash
# (seg -> runner, seg:state -> state), which the runner waits on before completing; a disputed segment also
# asks both disputants to re-run it with per-op digests (a message with `trace` = the disputant), and one that
# its runner lost rewinds the loop to the end of its confirmed prefix and queues it again.
SPOT = """
local policy = redis.call('HGET', KEYS[1], 'spot')
if not policy then return redis.error_reply('NOSPOT the graph has no spot-check policy') end
local rate, trust_after, copies, _, settle = string.match(policy, '^([^;]+);([^;]+);([^;]+);([^;]+);([^;]+)$')
rate, trust_after, copies, settle = tonumber(rate), tonumber(trust_after), tonumber(copies), tonumber(settle)
-- whose vote it is: the principal its key names (a worker user's scripts may name only its own key)
local member = string.match(KEYS[5], '^ravop:_:principal:(.+):vote$')
if not member or member ~= ARGV[1] then
  return redis.error_reply('NOPRINCIPAL ' .. KEYS[5] .. ' is not the key of principal ' .. ARGV[1])
end
local digest, class = ARGV[2], ARGV[7]
local votes, trust, ballots = KEYS[2], KEYS[3], ARGV[8]
local function digest_of(m) return redis.call('HGET', ballots .. m, 'd') end
local function voted(m) return redis.call('EXISTS', ballots .. m) == 1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function enqueue(n)
  for _ = 1, n do
    if ARGV[6] == '' then
      redis.call('XADD', KEYS[4], '*', 'token', ARGV[3], 'graph', ARGV[4], 'subgraph', ARGV[5])
    else
      redis.call('XADD', KEYS[4], '*', 'token', ARGV[3], 'graph', ARGV[4], 'subgraph', ARGV[5], 'segment', ARGV[6])
    end
  end
end
local function bump(m, field, by)
  local c = redis.call('HGET', ballots .. m, 'c') or class
  redis.call('HINCRBY', trust, m .. '@' .. c .. ':' .. field, by)
end
local function reset(m)
  local c = redis.call('HGET', ballots .. m, 'c') or class
  redis.call('HSET', trust, m .. '@' .. c .. ':streak', 0)
end
local segs = KEYS[6]
local function mark(state)
  if segs and redis.call('HEXISTS', segs, ARGV[6]) == 1 then redis.call('HSET', segs, ARGV[6] .. ':state', state) end
end
local function ask_traces(members)
  if not segs then return end
  redis.call('HSET', segs, '#disputes', (redis.call('HGET', segs, '#disputes') or '') .. ARGV[6] .. ',')
  for _, m in ipairs(members) do
    redis.call('XADD', KEYS[4], '*', 'token', ARGV[3], 'graph', ARGV[4], 'subgraph', ARGV[5], 'segment', ARGV[6],
               'trace', m)
  end
end
local function rewind(losers)
  -- the loop's runner lost: go back to the end of the segments confirmed from step 0 (or accepted unchecked
  -- from a runner that did not lose), forget the later ones, and queue the loop for an honest worker
  -- (whoever runs the loop now: a worker that took it over resumed from the loser's unconfirmed checkpoint)
  local runner = string.match(ARGV[6], ':(.*)$')
  if not losers[runner] or redis.call('HEXISTS', segs, ARGV[6]) == 0 then return end   -- rewound away already
  local entries = {}
  local all = redis.call('HGETALL', segs)
  for i = 1, #all, 2 do
    local s, e = string.match(all[i], '^(%d+)-(%d+):[^:]*$')
    if s then table.insert(entries, {tonumber(s), tonumber(e), all[i], all[i + 1]}) end
  end
  local at, moved = 0, true
  while moved do
    moved = false
    for _, entry in ipairs(entries) do
      local state = redis.call('HGET', segs, entry[3] .. ':state')
      if entry[1] == at and entry[2] > at and entry[3] ~= ARGV[6] and
          (state == 'confirmed' or ((state == 'unchecked' or state == 'unverified') and not losers[entry[4]])) then
        at, moved = entry[2], true
        break
      end
    end
  end
  for _, entry in ipairs(entries) do
    if entry[1] >= at then redis.call('HDEL', segs, entry[3], entry[3] .. ':state') end
  end
  if at == 0 then redis.call('DEL', KEYS[7]) else redis.call('HSET', KEYS[7], 'step', at) end
  redis.call('HSET', KEYS[8], ARGV[5], '-')
  redis.call('XADD', KEYS[4], '*', 'token', ARGV[3], 'graph', ARGV[4], 'subgraph', ARGV[5])
end
local function voters()
  local members = {}
  local all = redis.call('HGETALL', votes)
  for i = 1, #all, 2 do
    -- a name without its own vote key (any worker user may write this hash: the scripts keep state in it) is no vote
    if string.sub(all[i], 1, 1) ~= '#' and not string.find(all[i], ':', 1, true) and digest_of(all[i]) then
      table.insert(members, all[i])
    end
  end
  return members
end
local state = redis.call('HGET', votes, '#state')
if digest == '' then   -- the deadline check
  if state ~= 'checking' and state ~= 'disputed' then return {'again'} end
  local waited = now - tonumber(redis.call('HGET', votes, '#since') or now)
  if waited < settle then return {'hold'} end
  local runner = redis.call('HGET', votes, '#runner')
  if state == 'checking' then
    redis.call('HSET', votes, '#state', 'unverified', '#accepted', digest_of(runner))
    mark('unverified')
    bump(runner, 'unchecked', 1)
    return {'unverified', 'no worker of another user checked it within ' .. settle .. ' s'}
  end
  redis.call('HSET', votes, '#state', 'split')
  mark('split')
  local reply = {'split'}
  for _, m in ipairs(voters()) do
    reset(m)
    table.insert(reply, m)
  end
  return reply
end
if state == 'unchecked' or state == 'confirmed' or state == 'unverified' then
  if digest == redis.call('HGET', votes, '#accepted') then return {'complete'} end
  if voted(member) then return {'again'} end
  state = 'disputed'   -- a retry by another worker disagrees with what was accepted: settle it
  redis.call('HSET', votes, '#state', state, '#since', now)
elseif state == 'split' then
  return {'again'}
end
if voted(member) then return {'again'} end
redis.call('HSETNX', ballots .. member, 'd', digest)
redis.call('HSETNX', ballots .. member, 'c', class)
redis.call('HSET', votes, member, 1)
if not state then
  local streak = tonumber(redis.call('HGET', trust, member .. '@' .. class .. ':streak') or '0')
  local draw = tonumber(string.sub(redis.sha1hex(t[1] .. t[2] .. math.random() .. member .. ARGV[5] .. ARGV[6]),
                                   1, 8), 16) / 4294967296
  if segs then redis.call('HSET', segs, ARGV[6], member) end
  if streak >= trust_after and draw >= rate then
    redis.call('HSET', votes, '#state', 'unchecked', '#runner', member, '#accepted', digest)
    mark('unchecked')
    bump(member, 'unchecked', 1)
    return {'unchecked'}
  end
  redis.call('HSET', votes, '#state', 'checking', '#runner', member, '#since', now)
  mark('checking')
  enqueue(copies - 1)
  return {'hold'}
end
local members, count = voters(), {}
for _, m in ipairs(members) do
  local d = digest_of(m)
  count[d] = (count[d] or 0) + 1
end
local n = #members
if n < copies and state == 'checking' then return {'hold'} end
local top, top_count = nil, 0
for d, c in pairs(count) do if c > top_count then top, top_count = d, c end end
if top_count * 2 > n and digest == top then
  local losers, lost = {'confirmed'}, {}
  for _, m in ipairs(members) do
    if digest_of(m) == top then
      bump(m, 'confirmed', 1)
      bump(m, 'streak', 1)
    else
      reset(m)
      bump(m, 'mismatches', 1)
      -- kept from this graph's work at once; banned from the token's when the graph ends (by its requester)
      local out = redis.call('HGET', KEYS[1], 'outvoted') or ','
      if not string.find(out, ',' .. m .. ',', 1, true) then redis.call('HSET', KEYS[1], 'outvoted', out .. m .. ',') end
      table.insert(losers, m)
      lost[m] = true
    end
  end
  redis.call('HSET', votes, '#state', 'confirmed', '#accepted', top, '#losers', table.concat(losers, ',', 2))
  mark('confirmed')
  if segs and #losers > 1 then rewind(lost) end
  return losers
end
if n >= copies + 2 then
  redis.call('HSET', votes, '#state', 'split')
  mark('split')
  for _, m in ipairs(members) do reset(m) end
  local reply = {'split'}
  for _, m in ipairs(members) do table.insert(reply, m) end
  return reply
end
if state ~= 'disputed' then
  ask_traces(members)
  redis.call('HSET', votes, '#since', now)
end
redis.call('HSET', votes, '#state', 'disputed')
mark('disputed')
enqueue(1)
return {'hold'}
"""


class SpotScript:
    """SPOT registered on a client."""

    def __init__(self, client: Client) -> None:
        self._spot = client.register_script(SPOT)

    def submit(self, keys: GraphKeys, subgraph_id: Union[int, str], member: str, digest: str, kind: str,
               segment: Optional[str] = None, numerics_class: str = "") -> List[str]:
        """The reply (see the module docstring) to principal `member`'s digest of subgraph `subgraph_id`'s
        outputs, or of loop segment `segment`'s carried values ('': the deadline check), from a worker of
        numerics class `numerics_class` (its trust is kept under it); re-runs go to the work stream of device
        `kind`."""
        token = TokenKeys(keys.token)
        loop = [] if segment is None else [keys.segments(subgraph_id), keys.checkpoint(subgraph_id), keys.taken]
        reply = self._spot(keys=[keys.meta, keys.votes(subgraph_id, segment), token.trust, queue(kind),
                                 principal_key(member), *loop],
                           args=[member, digest, keys.token, keys.graph_id, subgraph_id,
                                 "" if segment is None else segment, numerics_class or kind,
                                 keys.vote(subgraph_id, segment)])
        return [part.decode() if isinstance(part, bytes) else str(part) for part in reply]
