"""The server-side half of adaptive spot checks (`R.Graph(verify='spot')`, ravop/core/spot_policy.py): one Lua script
that takes a worker's digest of a result (a plain subgraph's outputs, or a loop segment's carried values), draws
whether it is checked, counts the re-runs' digests, settles disputes by majority and keeps the workers' trust.
Everything is decided here, atomically, after the worker has handed its digest in, and the check's state is
derived from the voters' own write-once keys (CHECK; ravop.store.votes), never kept where another worker user could
write it. The draw is a hash of the graph, the result and the runner (ravop.store.votes.drawn), so that the
requester can verify each result accepted unchecked (ravop.client.bans.review).

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
# the ACL lets a worker user name only its own), the graph's policy (keys.policy: written by its requester only);
# for a loop segment also the loop's segments, checkpoint and taken hashes.
# ARGV: principal, digest ('' for the deadline check), token, graph id, subgraph id, segment ('' for a plain
# subgraph), the worker's numerics class, the prefix of the principals' own vote keys.
# The check's state is derived, each time, from the voters' own keys (CHECK below; ravop.store.votes.derive is the
# same rules for readers): each a hash only its user may write, once (HSETNX): d (digest), c (class), t (server
# time of the vote), o (the runner's draw: checking or unchecked), v (a deadline verdict: unverified or split). The
# votes hash only names them; nothing else in it counts, so a worker user writes no state but its own vote's.
# A segment is "start-end:runner" (worker/verify/spot_loop.py), listed in the loop's segments hash (seg -> runner);
# a disputed segment also asks both disputants to re-run it with per-op digests (a message with `trace` = the
# disputant), and one that its runner lost rewinds the loop to the end of its confirmed prefix and queues it again.
CHECK = """
local function check_of(votes, ballots, copies, now)
  -- a check's state from its voters' own keys; a name in `votes` without a vote key of its own is no vote
  local c = {members = {}, digest = {}, class = {}, t = {}}
  local checked, unchecked, verdict = false, false, nil
  for _, m in ipairs(redis.call('HKEYS', votes)) do
    if string.sub(m, 1, 1) ~= '#' and not string.find(m, ':', 1, true) then
      local f = redis.call('HMGET', ballots .. m, 'd', 'c', 't', 'o', 'v')
      if f[5] == 'split' then verdict = 'split'
      elseif f[5] == 'unverified' and not verdict then verdict = 'unverified' end
      if f[1] then
        local t = tonumber(f[3]) or 0
        if t > now then t = 0 end   -- a time to come was not the server's: counted as long past
        table.insert(c.members, m)
        c.digest[m], c.class[m], c.t[m] = f[1], f[2], t
        if f[4] == 'checking' then checked = true elseif f[4] == 'unchecked' then unchecked = true end
        if f[4] and (not c.runner or t < c.t[c.runner] or (t == c.t[c.runner] and m < c.runner)) then c.runner = m end
      end
    end
  end
  local n, count, first = #c.members, {}, nil
  for _, m in ipairs(c.members) do
    count[c.digest[m]] = (count[c.digest[m]] or 0) + 1
    if not first or c.t[m] < c.t[first] or (c.t[m] == c.t[first] and m < first) then first = m end
  end
  local top, top_count = nil, 0
  for d, k in pairs(count) do if k > top_count or (k == top_count and d < top) then top, top_count = d, k end end
  local majority = top_count * 2 > n
  c.n, c.top = n, top
  if n == 0 then c.state = nil
  elseif verdict == 'split' then c.state = 'split'
  elseif majority and n >= copies then c.state = 'confirmed'
  elseif majority and n == 1 and unchecked and not checked then c.state = 'unchecked'
  elseif majority and verdict == 'unverified' then c.state = 'unverified'
  elseif majority then c.state = 'checking'
  elseif n >= copies + 2 then c.state = 'split'
  else c.state = 'disputed' end
  if c.state == 'confirmed' or c.state == 'unchecked' or c.state == 'unverified' then c.accepted = top end
  c.since = first and c.t[first] or now
  if c.state == 'disputed' then   -- since the first vote that differs from the first one
    local since = nil
    for _, m in ipairs(c.members) do
      if c.digest[m] ~= c.digest[first] and (not since or c.t[m] < since) then since = c.t[m] end
    end
    c.since = since or c.since
  end
  return c
end
"""
SPOT = CHECK + """
local policy = redis.call('GET', KEYS[6])
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
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function voted(m) return redis.call('HEXISTS', ballots .. m, 'd') == 1 end
local function enqueue(n)
  for _ = 1, n do
    if ARGV[6] == '' then
      redis.call('XADD', KEYS[4], '*', 'token', ARGV[3], 'graph', ARGV[4], 'subgraph', ARGV[5])
    else
      redis.call('XADD', KEYS[4], '*', 'token', ARGV[3], 'graph', ARGV[4], 'subgraph', ARGV[5], 'segment', ARGV[6])
    end
  end
end
local function bump(m, c, field, by) redis.call('HINCRBY', trust, m .. '@' .. (c or class) .. ':' .. field, by) end
local function reset(m, c) redis.call('HSET', trust, m .. '@' .. (c or class) .. ':streak', 0) end
local segs = KEYS[7]
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
  local base = string.sub(votes, 1, #votes - #ARGV[6])   -- votes:{sid}: (each segment's check is base .. seg)
  local prefix = string.sub(ballots, 1, #ballots - #ARGV[6] - 1)
  for i = 1, #all, 2 do
    local s, e = string.match(all[i], '^(%d+)-(%d+):[^:]*$')
    if s then table.insert(entries, {tonumber(s), tonumber(e), all[i], all[i + 1]}) end
  end
  local at, moved = 0, true
  while moved do
    moved = false
    for _, entry in ipairs(entries) do
      if entry[1] == at and entry[2] > at and entry[3] ~= ARGV[6] then
        local state = check_of(base .. entry[3], prefix .. entry[3] .. ':', copies, now).state
        if state == 'confirmed' or ((state == 'unchecked' or state == 'unverified') and not losers[entry[4]]) then
          at, moved = entry[2], true
          break
        end
      end
    end
  end
  for _, entry in ipairs(entries) do
    if entry[1] >= at then redis.call('HDEL', segs, entry[3]) end
  end
  if at == 0 then redis.call('DEL', KEYS[8]) else redis.call('HSET', KEYS[8], 'step', at) end
  redis.call('HSET', KEYS[9], ARGV[5], '-')
  redis.call('XADD', KEYS[4], '*', 'token', ARGV[3], 'graph', ARGV[4], 'subgraph', ARGV[5])
end
local function verdict(v)   -- a deadline's verdict, in the caller's own key
  redis.call('HSETNX', ballots .. member, 'v', v)
  redis.call('HSETNX', votes, member, 1)
end
local before = check_of(votes, ballots, copies, now)
if digest == '' then   -- the deadline check
  if before.state ~= 'checking' and before.state ~= 'disputed' then return {'again'} end
  if now - before.since < settle then return {'hold'} end
  if before.state == 'checking' then
    verdict('unverified')
    bump(before.runner or before.members[1], before.class[before.runner or before.members[1]], 'unchecked', 1)
    return {'unverified', 'no worker of another user checked it within ' .. settle .. ' s'}
  end
  verdict('split')
  local reply = {'split'}
  for _, m in ipairs(before.members) do
    reset(m, before.class[m])
    table.insert(reply, m)
  end
  return reply
end
if before.state == 'unchecked' or before.state == 'confirmed' or before.state == 'unverified' then
  if digest == before.accepted then return {'complete'} end
elseif before.state == 'split' then
  return {'again'}
end
if voted(member) then return {'again'} end
redis.call('HSETNX', ballots .. member, 'd', digest)
redis.call('HSETNX', ballots .. member, 'c', class)
redis.call('HSETNX', ballots .. member, 't', string.format('%.6f', now))
redis.call('HSETNX', votes, member, 1)
if not before.state then   -- the first vote: the runner's, drawn (a draw its requester can verify: votes.drawn)
  local streak = tonumber(redis.call('HGET', trust, member .. '@' .. class .. ':streak') or '0')
  local draw = tonumber(string.sub(redis.sha1hex(ARGV[4] .. '/' .. ARGV[5] .. '/' .. ARGV[6] .. '/' .. member),
                                   1, 8), 16) / 4294967296
  if segs then redis.call('HSET', segs, ARGV[6], member) end
  if streak >= trust_after and draw >= rate then
    redis.call('HSETNX', ballots .. member, 'o', 'unchecked')
    bump(member, class, 'unchecked', 1)
    return {'unchecked'}
  end
  redis.call('HSETNX', ballots .. member, 'o', 'checking')
  enqueue(copies - 1)
  return {'hold'}
end
local after = check_of(votes, ballots, copies, now)
if after.state == 'confirmed' then
  local losers, lost, fresh = {'confirmed'}, {}, before.state ~= 'confirmed'
  for _, m in ipairs(after.members) do
    if after.digest[m] == after.top then
      if fresh then
        bump(m, after.class[m], 'confirmed', 1)
        bump(m, after.class[m], 'streak', 1)
      end
    else
      if fresh or m == member then
        reset(m, after.class[m])
        bump(m, after.class[m], 'mismatches', 1)
        -- kept from this graph's work at once; banned from the token's when the graph ends (by its requester)
        local out = redis.call('HGET', KEYS[1], 'outvoted') or ','
        if not string.find(out, ',' .. m .. ',', 1, true) then
          redis.call('HSET', KEYS[1], 'outvoted', out .. m .. ',')
        end
      end
      table.insert(losers, m)
      lost[m] = true
    end
  end
  if segs and fresh and #losers > 1 then rewind(lost) end
  if digest ~= after.top then   -- outvoted by this very vote's count: one of the majority stores the result
    if fresh and not segs then enqueue(1) end
    return {'hold'}
  end
  return losers
end
if after.state == 'split' then
  local reply = {'split'}
  for _, m in ipairs(after.members) do
    reset(m, after.class[m])
    table.insert(reply, m)
  end
  return reply
end
if after.state == 'disputed' then
  if before.state == 'checking' then ask_traces(after.members) end   -- a check's first disagreement is narrowed
  enqueue(1)
end
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
                                 principal_key(member), keys.policy, *loop],
                           args=[member, digest, keys.token, keys.graph_id, subgraph_id,
                                 "" if segment is None else segment, numerics_class or kind,
                                 keys.vote(subgraph_id, segment)])
        return [part.decode() if isinstance(part, bytes) else str(part) for part in reply]
