"""The Lua scripts that move a graph along, each atomic on the server, so that concurrent workers and retries
never enqueue a subgraph twice or lose one.

- start:    activated -> running; hand off the subgraphs that wait for nothing.
- claim:    a worker takes a subgraph: skip it unless its graph is running and it is not finished yet;
            record who took it; return the graph seed, the subgraph bytes, the graph's `verify` and its
            spot-check policy (`ravop.core.spot_policy`; '' for none).
- vote:     R.Graph(verify=k): record a digest of one worker's outputs of a subgraph; the k-th vote returns
            them all (start and complete enqueue each ready subgraph k times).
- complete: once per subgraph (a `done` set makes retries harmless), count progress, decrement the
            successors' dependency counts, hand off exactly those that reached zero, delete input values
            (and their chunks, `ravop.store.tensors`) no other subgraph will read, end the graph after
            its last subgraph.
- release superseded: a loop's first checkpoint releases the initial values of what it carries, as complete
            would (once: complete then skips them).
- dead:     ack a message and log it to the dead-letter stream.
- cancel:   end a graph with the op, error, source line and worker (only the first failure is kept: later
            ones are its consequences): failed by a worker's failure (after `dead`), cancelled by its requester.
- stop:     ask a running graph's loops to end at their next epoch boundary (worker/loops/loop_subgraph.py); the
            graph then completes, done, with what the loops had trained.

"Hand off" (`ravop.store.handoff`): on a standalone server the scripts also get the work streams as keys,
and put a ready subgraph on the stream of its device and ack the completed message themselves, as one step.
On a cluster the streams live in another slot than the graph, so a script pushes the subgraph to the graph's
outbox and returns it, and the caller moves it to the stream.

A subgraph's routing lives in its `info` entry, "device;n_ops;successor,...;input to release,...", written
at upload, so what a completion enqueues is defined by the uploaded plan, not by the worker.
"""
from typing import Any, Dict, Final, List, Optional, Tuple, Union

from redis.cluster import RedisCluster

from ..core import graph_states
from .client_types import Client, MessageId, Pipeline
from .keys import DEAD_LETTER, GROUP, GraphKeys, queue

def with_states(lua: str) -> str:
    """`lua` with the graph states it names as @ACTIVATED@, @RUNNING@, @DONE@, @FAILED@ and @CANCELLED@ spelled
    by ravop.core.graph_states, so that the scripts and the Python side cannot disagree on a state's name."""
    for name in ("ACTIVATED", "RUNNING", "DONE", "FAILED", "CANCELLED"):
        lua = lua.replace(f"@{name}@", getattr(graph_states, name))
    return lua


# What CLAIM answers, spelled once: the Lua below names them @CLAIM_RUN@ ... (`with_claim_replies`), the worker's
# reply -> action table (worker/serve/consumer.py, CLAIM_ACTIONS) by these names. Besides them it answers the state
# of a graph that is not running (ravop.core.graph_states).
CLAIM_RUN: Final = "run"             # the worker runs it: seed, subgraph bytes, verify copies and spot policy follow
CLAIM_GONE: Final = "gone"           # the graph is not in Redis (flushed since the message was queued, or never)
CLAIM_FINISHED: Final = "finished"   # a worker completed it (and may have died before handing off what it made ready)
CLAIM_UNKNOWN: Final = "unknown"     # not in the graph's plan: a message no engine sent
CLAIM_WAITING: Final = "waiting"     # not ready (its inputs are not computed yet): a message no engine sent
CLAIM_REPLIES: Final = {"RUN": CLAIM_RUN, "GONE": CLAIM_GONE, "FINISHED": CLAIM_FINISHED, "UNKNOWN": CLAIM_UNKNOWN,
                        "WAITING": CLAIM_WAITING}
assert set(CLAIM_REPLIES.values()).isdisjoint(graph_states.LIVE + graph_states.ENDED), "a reply is not a state"


def with_claim_replies(lua: str) -> str:
    """`lua` with the claim replies it names as @CLAIM_RUN@, @CLAIM_GONE@, ... spelled by CLAIM_REPLIES."""
    for name, reply in CLAIM_REPLIES.items():
        lua = lua.replace(f"@CLAIM_{name}@", reply)
    return lua


_COMMON = """
local function parse(info)
  return string.match(info, '^([^;]*);([^;]*);([^;]*);(.*)$')
end
local function now()
  local t = redis.call('TIME')
  return t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end
"""

# After the graph's own keys, a script that hands off gets the work streams cpu and cuda (standalone: XADD
# there), or not (cluster: the outbox gets subgraph id -> device, and the script returns
# "device;subgraph id;copies" for the caller to deliver). KEYS[queues] is the index of the cpu stream.
_HAND_OFF = """
local handed = {}
local function hand_off(meta, info, outbox, queues, token, graph, sid)
  local device = parse(redis.call('HGET', info, sid))
  local copies = redis.call('HGET', meta, 'verify') or '1'
  if #KEYS < queues then
    redis.call('HSET', outbox, sid, device)
    table.insert(handed, device .. ';' .. sid .. ';' .. copies)
    return
  end
  local stream = KEYS[queues]
  if device == 'cuda' then stream = KEYS[queues + 1] end
  for _ = 1, tonumber(copies) do
    redis.call('XADD', stream, '*', 'token', token, 'graph', graph, 'subgraph', sid)
  end
end
"""

# KEYS: meta, info, events, outbox[, queue:cpu, queue:cuda].  ARGV: token, graph id.
# Returns {1 if it started now else 0, entries handed to the outbox}.
START = with_states(_COMMON + _HAND_OFF + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return redis.error_reply('NOGRAPH graph ' .. ARGV[2] .. ' is not in Redis') end
if state ~= '@ACTIVATED@' then return {0, handed} end
redis.call('HSET', KEYS[1], 'state', '@RUNNING@', 'started', now())
if tonumber(redis.call('HGET', KEYS[1], 'n_subgraphs')) == 0 then
  redis.call('HSET', KEYS[1], 'state', '@DONE@', 'finished', now())
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', 16, '*', 'state', '@DONE@')
  return {1, handed}
end
for sid in string.gmatch(redis.call('HGET', KEYS[1], 'roots'), '[^,]+') do
  hand_off(KEYS[1], KEYS[2], KEYS[4], 5, ARGV[1], ARGV[2], sid)
end
return {1, handed}
""")

# KEYS: meta, done, subgraphs, taken, deps, outbox, held.  ARGV: subgraph id, worker.
# A claim by another worker than the last one appends it to the subgraph's holders (`held`: who ran a resident
# replica over time, a takeover or a turn a new name; the oldest dropped past HELD_CHARS characters).
# Anyone who may enqueue (every requester) can put a message naming another token's graph on a stream, so
# a message is only acted on if the plan has its subgraph and that subgraph is ready: a forged one is
# 'unknown' or 'waiting' and cannot fail or disturb the graph it names. A message for the subgraph is on a
# stream, so its outbox entry (a cluster's hand-off) is delivered: dropped.
HELD_CHARS = 2000   # the most of a subgraph's holders kept (`held`): about 200 names of workers
CLAIM = with_claim_replies(with_states("""
local meta = redis.call('HMGET', KEYS[1], 'state', 'seed', 'verify', 'spot')
if not meta[1] then return {'@CLAIM_GONE@'} end
redis.call('HDEL', KEYS[6], ARGV[1])
if meta[1] ~= '@RUNNING@' then return {meta[1]} end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return {'@CLAIM_FINISHED@'} end
local data = redis.call('HGET', KEYS[3], ARGV[1])
if not data then return {'@CLAIM_UNKNOWN@'} end
if tonumber(redis.call('HGET', KEYS[5], ARGV[1]) or '0') > 0 then return {'@CLAIM_WAITING@'} end
if redis.call('HGET', KEYS[4], ARGV[1]) ~= ARGV[2] then
  local held = redis.call('HGET', KEYS[7], ARGV[1])
  if held and string.len(held) > HELD_CHARS then
    local cut = string.find(held, ',', -HELD_CHARS, true)
    held = cut and string.sub(held, cut + 1)
  end
  redis.call('HSET', KEYS[7], ARGV[1], held and (held .. ',' .. ARGV[2]) or ARGV[2])
end
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
return {'@CLAIM_RUN@', meta[2] or '0', data, meta[3] or '1', meta[4] or ''}
""")).replace("HELD_CHARS", str(HELD_CHARS))

# KEYS: the subgraph's voters, the worker's own vote key.  ARGV: worker (its principal), digest of its outputs,
# copies wanted, the prefix of the principals' vote keys (GraphKeys.vote).
# The votes once `copies` principals have voted (to the voter that completed them, and to any later one), else {}.
# Each vote is read from its principal's own key, which only that worker user may write, once (ravop.store.votes):
# a name another user added to the voters' hash without a vote of its own counts for nothing.
VOTE = """
redis.call('HSETNX', KEYS[2], 'd', ARGV[2])
redis.call('HSETNX', KEYS[1], ARGV[1], 1)
local votes = {}
for _, m in ipairs(redis.call('HKEYS', KEYS[1])) do
  local d = not string.find(m, '[:#]') and redis.call('HGET', ARGV[4] .. m, 'd')
  if d then
    table.insert(votes, m)
    table.insert(votes, d)
  end
end
if #votes < 2 * tonumber(ARGV[3]) then return {} end
return votes
"""

# KEYS: meta, done, info, deps, ran, refs, events, outbox[, queue:cpu, queue:cuda, the message's stream].
# ARGV: subgraph id, worker, token, graph id, message id, group, tensor key prefix.
# Returns {status, entries handed to the outbox}; status 1 (completed), 0 (already completed, or the graph
# is no longer running), -1 (the graph is gone). With the streams given, it also acks the message.
COMPLETE = with_states(_COMMON + _HAND_OFF + """
if #KEYS > 8 and ARGV[5] ~= '' then
  redis.call('XACK', KEYS[11], ARGV[6], ARGV[5])
  redis.call('XDEL', KEYS[11], ARGV[5])
end
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {-1, handed} end
if state ~= '@RUNNING@' then return {0, handed} end
local info = redis.call('HGET', KEYS[3], ARGV[1])
if not info then return redis.error_reply('NOSUBGRAPH subgraph ' .. ARGV[1] .. ' is not in the plan') end
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return {0, handed} end
local _, n_ops, successors, release = parse(info)
redis.call('HSET', KEYS[5], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'ops_done', n_ops)
for sid in string.gmatch(successors, '[^,]+') do
  if redis.call('HINCRBY', KEYS[4], sid, -1) == 0 then
    hand_off(KEYS[1], KEYS[3], KEYS[8], 9, ARGV[3], ARGV[4], sid)
  end
end
for id in string.gmatch(release, '[^,]+') do
  -- an input its loop released at its first checkpoint (RELEASE_SUPERSEDED) is not counted twice
  if redis.call('HDEL', KEYS[6], 'early:' .. ARGV[1] .. ':' .. id) == 0 and
     redis.call('HINCRBY', KEYS[6], id, -1) <= 0 then
    redis.call('DEL', ARGV[7] .. id, ARGV[7] .. id .. ':c', ARGV[7] .. id .. ':f', ARGV[7] .. id .. ':u')
    redis.call('HDEL', KEYS[6], id)
  end
end
if redis.call('HINCRBY', KEYS[1], 'done_subgraphs', 1) == tonumber(redis.call('HGET', KEYS[1], 'n_subgraphs')) then
  redis.call('HSET', KEYS[1], 'state', '@DONE@', 'finished', now())
  redis.call('XADD', KEYS[7], 'MAXLEN', '~', 16, '*', 'state', '@DONE@')
end
return {1, handed}
""")

# KEYS: info, refs.  ARGV: subgraph id, tensor key prefix, input ids.
# A loop whose first checkpoint is published releases the initial values of what it carries, which a resumed loop
# reads from the checkpoint instead (worker/loops/loop_subgraph.py): each id in the subgraph's release list is
# released as COMPLETE would release it (deleted once no other subgraph reads it), once (the 'early:' field, which
# COMPLETE consumes instead of counting the id again). Returns how many it released now.
RELEASE_SUPERSEDED = _COMMON + """
local info = redis.call('HGET', KEYS[1], ARGV[1])
if not info then return 0 end
local _, _, _, release = parse(info)
local listed = {}
for id in string.gmatch(release, '[^,]+') do listed[id] = true end
local released = 0
for k = 3, #ARGV do
  local id = ARGV[k]
  if listed[id] and redis.call('HINCRBY', KEYS[2], 'early:' .. ARGV[1] .. ':' .. id, 1) == 1 then
    released = released + 1
    if redis.call('HINCRBY', KEYS[2], id, -1) <= 0 then
      redis.call('DEL', ARGV[2] .. id, ARGV[2] .. id .. ':c', ARGV[2] .. id .. ':f', ARGV[2] .. id .. ':u')
      redis.call('HDEL', KEYS[2], id)
    end
  end
end
return released
"""

# KEYS: meta, events.  ARGV: subgraph id, worker, op, source, error[, who cancelled].
# Ends an activated or running graph (1), else 0: failed by a worker's failure, or cancelled by its requester
# (`ravop cancel`), named in `cancelled_by`.
CANCEL = with_states(_COMMON + """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= '@RUNNING@' and state ~= '@ACTIVATED@' then return 0 end
local ended = '@FAILED@'
if ARGV[6] and ARGV[6] ~= '' then
  ended = '@CANCELLED@'
  redis.call('HSET', KEYS[1], 'cancelled_by', ARGV[6])
end
redis.call('HSET', KEYS[1], 'state', ended, 'finished', now(), 'error', ARGV[5], 'error_op', ARGV[3],
           'error_source', ARGV[4], 'error_worker', ARGV[2], 'error_subgraph', ARGV[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 16, '*', 'state', ended)
return 1
""")

# KEYS: meta.  ARGV: why, who asks.  Asks a running (or activated) graph's loops to stop (1), else 0; the first
# request is kept.
STOP = with_states("""
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= '@RUNNING@' and state ~= '@ACTIVATED@' then return 0 end
redis.call('HSETNX', KEYS[1], 'stop', ARGV[1])
redis.call('HSETNX', KEYS[1], 'stop_by', ARGV[2])
return 1
""")

# KEYS: dead letters, the message's stream (one slot: ravop.store.keys).
# ARGV: message id, group, token, graph id, subgraph id, worker, op, source, error, reason, message.
# The dead-letter stream holds every token's failures: it is the workers' (a requester cannot write it).
DEAD = """
if ARGV[1] ~= '' then
  redis.call('XACK', KEYS[2], ARGV[2], ARGV[1])
  redis.call('XDEL', KEYS[2], ARGV[1])
end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', 10000, '*', 'token', ARGV[3], 'graph', ARGV[4], 'subgraph', ARGV[5],
           'worker', ARGV[6], 'op', ARGV[7], 'source', ARGV[8], 'error', ARGV[9], 'reason', ARGV[10],
           'message', ARGV[11])
"""


def release_superseded(client: Client, keys: GraphKeys, subgraph_id: Union[int, str], ids: List[int]) -> int:
    """Release the inputs `ids` of loop subgraph `subgraph_id` that its published checkpoint supersedes (see
    RELEASE_SUPERSEDED); how many were released now."""
    script = client.register_script(RELEASE_SUPERSEDED)
    return int(script(keys=[keys.info, keys.refs], args=[subgraph_id, keys.tensor_prefix, *ids]))


def is_cluster(client: Client) -> bool:
    """Whether `client` is a Redis Cluster client (ravop.store.connect picks it for a cluster's URL)."""
    return isinstance(client, RedisCluster)


class Scripts:
    """The scripts registered once on a client (redis-py loads each on first use and after a server restart).
    On a standalone server they are given the work streams, and hand off by themselves (`direct`)."""

    def __init__(self, client: Client) -> None:
        self.client, self.direct = client, not is_cluster(client)
        self._start = client.register_script(START)
        self._claim = client.register_script(CLAIM)
        self._complete = client.register_script(COMPLETE)
        self._dead = client.register_script(DEAD)
        self._vote = client.register_script(VOTE)
        self._cancel = client.register_script(CANCEL)
        self._stop = client.register_script(STOP)

    def load(self) -> None:
        """Put every script on the server now (a worker does before it takes work). Otherwise the first claim and
        the first completion after the server started each cost three round trips (EVALSHA refused, SCRIPT LOAD,
        EVALSHA again): 0.1 s more before a loop's first step on a 50 ms link. A server restarted later loses
        them; then they are loaded on first use again, as before."""
        scripts = (self._start, self._claim, self._complete, self._dead, self._vote, self._cancel, self._stop)
        if not self.direct:   # a cluster routes SCRIPT LOAD to every primary, one command at a time
            for script in scripts:
                self.client.script_load(script.script)
            return
        pipe = self.client.pipeline(transaction=False)
        for script in scripts:
            pipe.script_load(script.script)
        pipe.execute()

    def _streams(self, *more: str) -> List[str]:
        return [queue("cpu"), queue("cuda"), *more] if self.direct else []

    def start(self, keys: GraphKeys) -> Tuple[int, List[bytes]]:
        """(1 if the graph started now else 0, outbox entries to deliver); ResponseError NOGRAPH if it is gone."""
        started, handed = self._start(keys=[keys.meta, keys.info, keys.events, keys.outbox, *self._streams()],
                                      args=[keys.token, keys.graph_id])
        return started, handed

    def claim(self, keys: GraphKeys, subgraph_id: Union[int, str], worker: str) -> List[Any]:
        """[CLAIM_RUN, seed, subgraph bytes, verify copies, spot policy or b''] if `worker` may run it now; else
        [why]: another of CLAIM_REPLIES, or the state of a graph that is not running (as bytes)."""
        return self._claim(keys=self._claim_keys(keys), args=[subgraph_id, worker])

    @staticmethod
    def _claim_keys(keys: GraphKeys) -> List[str]:
        return [keys.meta, keys.done, keys.subgraphs, keys.taken, keys.deps, keys.outbox, keys.held]

    def claim_in(self, pipe: Pipeline, keys: GraphKeys, subgraph_id: Union[int, str], worker: str) -> None:
        """Queue the claim in `pipe` (with other reads of its round trip); its reply is `claim`'s. EVALSHA directly,
        as `complete_in`: the caller claims again with `claim` on NoScriptError."""
        call_keys = self._claim_keys(keys)
        pipe.execute_command("EVALSHA", self._claim.sha, len(call_keys), *call_keys, subgraph_id, worker)

    def cancel(self, keys: GraphKeys, error: str, subgraph_id: Union[int, str] = "", worker: str = "", op: str = "",
               source: str = "", by: str = "") -> int:
        """Fail an activated or running graph with `error` (cancelled instead, if `by` names who cancels it); 1 if
        it was, 0 if it had already ended."""
        return self._cancel(keys=[keys.meta, keys.events], args=[subgraph_id, worker, op, source, error, by])

    def stop(self, keys: GraphKeys, why: str, by: str) -> int:
        """Ask a live graph's loops to stop at their next epoch boundary; 1 if asked, 0 if it had already ended."""
        return self._stop(keys=[keys.meta], args=[why, by])

    def vote(self, keys: GraphKeys, subgraph_id: Union[int, str], worker: str, digest: str,
             copies: int) -> Dict[str, str]:
        """{worker: digest} once `copies` workers have voted on the subgraph's outputs, else {}."""
        reply = self._vote(keys=[keys.votes(subgraph_id), keys.vote(subgraph_id, None, worker)],
                           args=[worker, digest, copies, keys.vote(subgraph_id)])
        return {reply[i].decode(): reply[i + 1].decode() for i in range(0, len(reply), 2)}

    def _complete_call(self, keys: GraphKeys, subgraph_id: Union[int, str], worker: str, stream: str,
                       message_id: MessageId) -> Tuple[List[str], List[Any]]:
        return ([keys.meta, keys.done, keys.info, keys.deps, keys.ran, keys.refs, keys.events, keys.outbox,
                 *self._streams(stream)],
                [subgraph_id, worker, keys.token, keys.graph_id, message_id, GROUP, keys.tensor_prefix])

    def complete(self, keys: GraphKeys, subgraph_id: Union[int, str], worker: str, stream: str,
                 message_id: MessageId) -> Tuple[Any, List[bytes]]:
        """(status, outbox entries to deliver): see COMPLETE. Acks the message itself only if `direct`."""
        call_keys, args = self._complete_call(keys, subgraph_id, worker, stream, message_id)
        status, handed = self._complete(keys=call_keys, args=args)
        return status, handed

    def complete_in(self, pipe: Pipeline, keys: GraphKeys, subgraph_id: Union[int, str], worker: str, stream: str,
                    message_id: MessageId) -> None:
        """Queue the completion in `pipe` after the output writes, so the whole finish is one round trip; its
        reply is COMPLETE's. EVALSHA directly: redis-py would otherwise check SCRIPT EXISTS first, a second round
        trip; the caller falls back to `complete` on NoScriptError (only after a server restart). Through
        execute_command: a cluster pipeline refuses `pipe.evalsha`, though the server runs it in a MULTI of one
        slot as anywhere."""
        call_keys, args = self._complete_call(keys, subgraph_id, worker, stream, message_id)
        pipe.execute_command("EVALSHA", self._complete.sha, len(call_keys), *call_keys, *args)

    def fail(self, keys: Optional[GraphKeys], stream: str, message_id: MessageId, subgraph_id: Union[int, str] = "",
             worker: str = "", op: str = "", source: str = "", error: str = "", reason: str = "", message: str = "",
             fail_graph: bool = True) -> None:
        """Fail the message's graph (unless `keys` is None, for a message that names no valid graph, or
        `fail_graph` is False: logged as about that graph, which is left alone), then dead-letter and ack
        the message: a crash in between leaves it pending, and whoever takes it over fails it again."""
        if keys is not None and fail_graph:
            self.cancel(keys, error, subgraph_id, worker, op, source)
        token, graph_id = (keys.token, keys.graph_id) if keys is not None else ("", "")
        self._dead(keys=[DEAD_LETTER, stream], args=[message_id, GROUP, token, graph_id, subgraph_id, worker, op,
                                                     source, error, reason, message])
