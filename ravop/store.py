"""The Redis schema both sides share: key names, queue streams, and the scripts that move a graph along.

Keys of one graph live under `ravop:{token}:g:{graph_id}:`:
  meta      hash: name, state (activated|running|done|failed), n_subgraphs, done, n_ops, ops_done, seed,
            device, error (JSON: op, error, worker, source)
  plan      hash: subgraph id -> Subgraph protobuf bytes
  deps      hash: subgraph id -> predecessors not yet finished
  finished  set of finished subgraph ids (makes completion idempotent under retries)
  attempts  hash: subgraph id -> deliveries started
  ran_by    hash: subgraph id -> worker name
  persist   hash: persist name -> node id;  bundles  hash: name -> JSON (kind, spec, keys)
  t:{id}    tensor bytes (ravop.wire.codec) of node `id`
Per token: `ravop:{token}:graphs` (list of graph ids) and `ravop:{token}:current`.
Queues: one stream per device kind, `ravop:queue:{cpu|cuda}`, consumer group `workers`; messages carry token,
graph and subgraph id. Poisoned messages go to `ravop:deadletter`. Live workers: `ravop:workers:{device}:{name}`.
"""
import json

GROUP = "workers"
DEAD_LETTER = "ravop:deadletter"
DEVICE_KINDS = ("cpu", "cuda")


def queue(device_kind):
    return f"ravop:queue:{device_kind}"


def worker_key(device_kind, name):
    return f"ravop:workers:{device_kind}:{name}"


def token_key(token, part):
    return f"ravop:{token}:{part}"


class GraphKeys:
    """Key names of one graph."""
    __slots__ = ("token", "graph_id", "prefix")

    def __init__(self, token, graph_id):
        self.token, self.graph_id = token, graph_id
        self.prefix = f"ravop:{token}:g:{graph_id}:"

    def __getattr__(self, part):  # meta, plan, deps, finished, attempts, ran_by, persist, bundles
        return self.prefix + part

    def tensor(self, node_id):
        return f"{self.prefix}t:{node_id}"


# Finishing a subgraph: mark it finished once, decrement its successors' counts, enqueue those that reached
# zero, and count progress. Atomic, so concurrent finishes enqueue each successor exactly once.
# KEYS: finished, deps, meta.  ARGV: subgraph id, its op count, token, graph id, then (successor, stream)...
COMPLETE = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
for i = 5, #ARGV, 2 do
  if redis.call('HINCRBY', KEYS[2], ARGV[i], -1) == 0 then
    redis.call('XADD', ARGV[i + 1], '*', 'token', ARGV[3], 'graph', ARGV[4], 'sg', ARGV[i])
  end
end
redis.call('HINCRBY', KEYS[3], 'ops_done', ARGV[2])
local done = redis.call('HINCRBY', KEYS[3], 'done', 1)
if done >= tonumber(redis.call('HGET', KEYS[3], 'n_subgraphs')) and redis.call('HGET', KEYS[3], 'state') == 'running' then
  redis.call('HSET', KEYS[3], 'state', 'done')
end
return 1
"""

# Failing a graph keeps the first error: later failures of the same graph are consequences of it.
# KEYS: meta.  ARGV: error JSON.
FAIL = """
if redis.call('HGET', KEYS[1], 'state') == 'failed' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'failed', 'error', ARGV[1])
return 1
"""


def error_json(op="", error="", worker="", source="", subgraph=""):
    return json.dumps({"op": op, "error": error, "worker": worker, "source": source, "subgraph": subgraph})


def describe_error(raw):
    """A one-line account of a graph failure from the error JSON stored in meta."""
    try:
        info = json.loads(raw)
    except (TypeError, ValueError):
        return str(raw)
    where = f" at {info['source']}" if info.get("source") else ""
    op = f"op {info['op']!r}" if info.get("op") else "subgraph " + str(info.get("subgraph", "?"))
    return f"{op}{where} failed on worker {info.get('worker') or '?'}: {info.get('error')}"


def ensure_groups(client):
    """Create every device stream's consumer group (idempotent)."""
    import redis
    for kind in DEVICE_KINDS:
        try:
            client.xgroup_create(queue(kind), GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
