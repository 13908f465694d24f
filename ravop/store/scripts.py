"""The Lua scripts that move a graph along, each atomic on the server, so that concurrent workers and retries
never enqueue a subgraph twice or lose one.

- start:    activated -> running; enqueue the subgraphs that wait for nothing.
- claim:    a worker takes a subgraph: skip it unless its graph is running and it is not finished yet;
            record who took it; return the graph seed, the subgraph bytes and the graph's `verify`.
- vote:     R.Graph(verify=k): record a digest of one worker's outputs of a subgraph; the k-th vote returns
            them all (start and complete enqueue each ready subgraph k times).
- complete: ack the message; once per subgraph (a `done` set makes retries harmless), count progress,
            decrement the successors' dependency counts, enqueue exactly those that reached zero on the
            stream of their device, delete input values (and their chunks, `ravop.store.tensors`) no other
            subgraph will read, end the graph after
            its last subgraph.
- fail:     ack the message, log it to the dead-letter stream, and fail its graph with the op, error,
            source line and worker (only the first failure is kept: later ones are its consequences).
- cancel:   fail a graph on its requester's word, without a dead letter.

A subgraph's routing lives in its `info` entry, "device;n_ops;successor,...;input to release,...", written
at upload, so what a completion enqueues is defined by the uploaded plan, not by the worker.
"""
from .keys import DEAD_LETTER, GROUP, NO_GRAPH, queue

_COMMON = """
local function parse(info)
  return string.match(info, '^([^;]*);([^;]*);([^;]*);(.*)$')
end
local function now()
  local t = redis.call('TIME')
  return t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end
"""

# KEYS: meta, info, events, queue:cpu, queue:cuda.  ARGV: token, graph id.
START = _COMMON + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return redis.error_reply('NOGRAPH graph ' .. ARGV[2] .. ' is not in Redis') end
if state ~= 'activated' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'running', 'started', now())
if tonumber(redis.call('HGET', KEYS[1], 'n_subgraphs')) == 0 then
  redis.call('HSET', KEYS[1], 'state', 'done', 'finished', now())
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', 16, '*', 'state', 'done')
  return 1
end
local copies = tonumber(redis.call('HGET', KEYS[1], 'verify') or '1')
for sid in string.gmatch(redis.call('HGET', KEYS[1], 'roots'), '[^,]+') do
  local device = parse(redis.call('HGET', KEYS[2], sid))
  local stream = KEYS[4]
  if device == 'cuda' then stream = KEYS[5] end
  for _ = 1, copies do
    redis.call('XADD', stream, '*', 'token', ARGV[1], 'graph', ARGV[2], 'subgraph', sid)
  end
end
return 1
"""

# KEYS: meta, done, subgraphs, taken, deps.  ARGV: subgraph id, worker.
# Anyone who may enqueue (every requester) can put a message naming another token's graph on a stream, so
# a message is only acted on if the plan has its subgraph and that subgraph is ready: a forged one is
# 'unknown' or 'waiting' and cannot fail or disturb the graph it names.
CLAIM = """
local meta = redis.call('HMGET', KEYS[1], 'state', 'seed', 'verify')
if not meta[1] then return {'gone'} end
if meta[1] ~= 'running' then return {meta[1]} end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return {'finished'} end
local data = redis.call('HGET', KEYS[3], ARGV[1])
if not data then return {'unknown'} end
if tonumber(redis.call('HGET', KEYS[5], ARGV[1]) or '0') > 0 then return {'waiting'} end
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
return {'run', meta[2] or '0', data, meta[3] or '1'}
"""

# KEYS: the subgraph's votes.  ARGV: worker, digest of its outputs, copies wanted.
# The votes once `copies` workers have voted (to the voter that completed them, and to any later one), else {}.
VOTE = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if redis.call('HLEN', KEYS[1]) < tonumber(ARGV[3]) then return {} end
return redis.call('HGETALL', KEYS[1])
"""

# KEYS: meta, done, info, deps, ran, refs, events, queue:cpu, queue:cuda, the message's stream.
# ARGV: subgraph id, worker, token, graph id, message id, group, tensor key prefix.
# Returns 1 (completed), 0 (already completed, or the graph is no longer running), -1 (the graph is gone).
COMPLETE = _COMMON + """
if ARGV[5] ~= '' then
  redis.call('XACK', KEYS[10], ARGV[6], ARGV[5])
  redis.call('XDEL', KEYS[10], ARGV[5])
end
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -1 end
if state ~= 'running' then return 0 end
local info = redis.call('HGET', KEYS[3], ARGV[1])
if not info then return redis.error_reply('NOSUBGRAPH subgraph ' .. ARGV[1] .. ' is not in the plan') end
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return 0 end
local _, n_ops, successors, release = parse(info)
redis.call('HSET', KEYS[5], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'ops_done', n_ops)
local copies = tonumber(redis.call('HGET', KEYS[1], 'verify') or '1')
for sid in string.gmatch(successors, '[^,]+') do
  if redis.call('HINCRBY', KEYS[4], sid, -1) == 0 then
    local device = parse(redis.call('HGET', KEYS[3], sid))
    local stream = KEYS[8]
    if device == 'cuda' then stream = KEYS[9] end
    for _ = 1, copies do
      redis.call('XADD', stream, '*', 'token', ARGV[3], 'graph', ARGV[4], 'subgraph', sid)
    end
  end
end
for id in string.gmatch(release, '[^,]+') do
  if redis.call('HINCRBY', KEYS[6], id, -1) <= 0 then
    redis.call('DEL', ARGV[7] .. id, ARGV[7] .. id .. ':c')
    redis.call('HDEL', KEYS[6], id)
  end
end
if redis.call('HINCRBY', KEYS[1], 'done_subgraphs', 1) == tonumber(redis.call('HGET', KEYS[1], 'n_subgraphs')) then
  redis.call('HSET', KEYS[1], 'state', 'done', 'finished', now())
  redis.call('XADD', KEYS[7], 'MAXLEN', '~', 16, '*', 'state', 'done')
end
return 1
"""

_FAIL_GRAPH = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'running' and state ~= 'activated' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'failed', 'finished', now(), 'error', ARGV[9], 'error_op', ARGV[7],
           'error_source', ARGV[8], 'error_worker', ARGV[6], 'error_subgraph', ARGV[5])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 16, '*', 'state', 'failed')
return 1
"""

# KEYS: meta, events, dead letters, the message's stream.
# ARGV: message id, group, token, graph id, subgraph id, worker, op, source, error, reason, message.
FAIL = _COMMON + """
if ARGV[1] ~= '' then
  redis.call('XACK', KEYS[4], ARGV[2], ARGV[1])
  redis.call('XDEL', KEYS[4], ARGV[1])
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'token', ARGV[3], 'graph', ARGV[4], 'subgraph', ARGV[5],
           'worker', ARGV[6], 'op', ARGV[7], 'source', ARGV[8], 'error', ARGV[9], 'reason', ARGV[10],
           'message', ARGV[11])
""" + _FAIL_GRAPH

# KEYS: meta, events.  ARGV: as FAIL's. Ends the graph without a dead letter: what a requester may do to its
# own graph (`ravop cancel`); the dead-letter stream, which holds every token's failures, is the workers'.
CANCEL = _COMMON + _FAIL_GRAPH


class Scripts:
    """The scripts registered once on a client (redis-py loads each on first use and after a server restart)."""

    def __init__(self, client):
        self._start = client.register_script(START)
        self._claim = client.register_script(CLAIM)
        self._complete = client.register_script(COMPLETE)
        self._fail = client.register_script(FAIL)
        self._vote = client.register_script(VOTE)
        self._cancel = client.register_script(CANCEL)

    def start(self, keys):
        """1 if the graph started now, 0 if it had already started; ResponseError NOGRAPH if it is gone."""
        return self._start(keys=[keys.meta, keys.info, keys.events, queue("cpu"), queue("cuda")],
                           args=[keys.token, keys.graph_id])

    def claim(self, keys, subgraph_id, worker):
        """[b'run', seed, subgraph bytes, verify copies] if `worker` may run it now; else [why]: b'gone', a graph state,
        b'finished', b'unknown' (not in the plan), b'waiting' (not ready)."""
        return self._claim(keys=[keys.meta, keys.done, keys.subgraphs, keys.taken, keys.deps],
                           args=[subgraph_id, worker])

    def cancel(self, keys, error):
        """Fail an activated or running graph with `error`; 1 if it was, 0 if it had already ended."""
        return self._cancel(keys=[keys.meta, keys.events], args=["", "", keys.token, keys.graph_id, "", "", "", "",
                                                                 error])

    def vote(self, keys, subgraph_id, worker, digest, copies):
        """{worker: digest} once `copies` workers have voted on the subgraph's outputs, else {}."""
        reply = self._vote(keys=[keys.votes(subgraph_id)], args=[worker, digest, copies])
        return {reply[i].decode(): reply[i + 1].decode() for i in range(0, len(reply), 2)}

    def _complete_call(self, keys, subgraph_id, worker, stream, message_id):
        return ([keys.meta, keys.done, keys.info, keys.deps, keys.ran, keys.refs, keys.events, queue("cpu"),
                 queue("cuda"), stream],
                [subgraph_id, worker, keys.token, keys.graph_id, message_id, GROUP, keys.tensor_prefix])

    def complete(self, keys, subgraph_id, worker, stream, message_id):
        call_keys, args = self._complete_call(keys, subgraph_id, worker, stream, message_id)
        return self._complete(keys=call_keys, args=args)

    def complete_in(self, pipe, keys, subgraph_id, worker, stream, message_id):
        """Queue the completion in `pipe` after the output writes, so the whole finish is one round trip.
        EVALSHA directly: redis-py would otherwise check SCRIPT EXISTS first, a second round trip; the caller
        falls back to `complete` on NoScriptError (only after a server restart)."""
        call_keys, args = self._complete_call(keys, subgraph_id, worker, stream, message_id)
        pipe.evalsha(self._complete.sha, len(call_keys), *call_keys, *args)

    def fail(self, keys, stream, message_id, subgraph_id="", worker="", op="", source="", error="", reason="",
             message="", fail_graph=True):
        """Dead-letter a message and fail its graph. `keys` is None for a message that names no valid graph;
        with `fail_graph=False` the message is logged as about that graph but the graph is left alone."""
        meta, events = (keys.meta, keys.events) if keys is not None and fail_graph else (NO_GRAPH, NO_GRAPH)
        token, graph_id = (keys.token, keys.graph_id) if keys is not None else ("", "")
        return self._fail(keys=[meta, events, DEAD_LETTER, stream],
                          args=[message_id, GROUP, token, graph_id, subgraph_id, worker, op, source, error,
                                reason, message])
