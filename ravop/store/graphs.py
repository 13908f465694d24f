"""The requester's side of the schema: upload an activated graph, read its state, list and cancel graphs.

Only `upload` handles tensors: it imports the modules that load torch (tensors, same_host, background_upload) when
it runs, so that reading a graph's state (`ravop status`, `graphs`, `logs`, `cancel`, `stop`, `admin`) starts in
a fraction of a second without torch (tests/tools/test_cli_no_torch.py)."""
import json
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import redis

from ..core import graph_states, plan_limits
from .client_types import Client
from .keys import GraphKeys, TokenKeys, device_kind

if TYPE_CHECKING:
    import torch

BATCH_BYTES = 32 * 2**20  # one pipeline carries about this much, so a big model is neither one huge
BATCH_FIELDS = 10_000     # request nor a round trip per tensor


class _Batcher:
    """A pipeline that sends itself once it holds about BATCH_BYTES or BATCH_FIELDS."""

    def __init__(self, client: Client) -> None:
        self.pipe = client.pipeline(transaction=False)
        self.bytes = self.fields = 0

    def add(self, size: int, fields: int = 1) -> None:
        self.bytes += size
        self.fields += fields
        if self.bytes >= BATCH_BYTES or self.fields >= BATCH_FIELDS:
            self.send()

    def send(self) -> None:
        self.pipe.execute()
        self.bytes = self.fields = 0


def upload(client: Client, token: str, plan: Any, constants: Mapping[int, "torch.Tensor"], meta: Mapping[str, Any],
           bundles: Optional[Mapping[str, Tuple[str, Any, Mapping[str, str]]]] = None) -> GraphKeys:
    """Write an activated graph: subgraphs, routing, dependency and reader counts, persist names, bundles,
    constants, and its meta last (workers and trackers only look at a graph that has a meta); the chunks of big
    constants that got a same-host file go on a thread after it (ravop.store.background_upload).

    `plan`: a `ravop.wire.plan_pb2.Plan`; `constants`: node id -> tensor; `meta`: extra fields (name,
    algorithm, approach, summary, ...); `bundles`: name -> (kind, spec, {key: persist name})."""
    from . import background_upload, quotas, row_stream, same_host, seals, tensors   # load torch: see the docstring
    from ..wire.persisted import persisted_ids
    keys = GraphKeys(token, plan.graph_id)
    # Checked before anything is written: a graph that cannot fit fails here, not halfway through.
    plan_limits.check_plan(plan)
    constant_bytes = sum(t.nbytes for t in constants.values())
    quotas.check_memory(client, token, constant_bytes, f"graph {plan.graph_id}'s constants")
    chunk = tensors.fit_to_server(client, constant_bytes, "the graph's constants", keys.meta)
    token_keys = TokenKeys(token)
    persisted = set(plan.persisted.values())
    readers: Counter[int] = Counter()
    roots, devices, n_ops = [], set(), 0
    batch = _Batcher(client)
    batch.pipe.sadd(token_keys.owned, plan.graph_id)   # first: R.flush finds every key after it (ravop.store.flush)
    for sub in plan.subgraphs:
        device = device_kind(sub.device or "cpu")
        devices.add(device)
        release = [i for i in sub.inputs if i not in persisted]
        readers.update(release)
        info = f"{device};{len(sub.nodes.id)};{','.join(map(str, sub.successors))};{','.join(map(str, release))}"
        data = sub.SerializeToString()
        batch.pipe.hset(keys.subgraphs, sub.id, data)
        batch.pipe.hset(keys.info, sub.id, info)
        if sub.n_predecessors:
            batch.pipe.hset(keys.deps, sub.id, sub.n_predecessors)
        else:
            roots.append(sub.id)
        n_ops += len(sub.nodes.id)
        batch.add(len(data) + len(info), 3)
    if readers:
        batch.pipe.hset(keys.refs, mapping=dict(readers))
    if plan.persisted:
        batch.pipe.hset(keys.persist, mapping=dict(plan.persisted))
    rules = [rule.encode() for rule in persisted_ids(plan).rules]
    if rules:
        batch.pipe.hset(keys.persist_rules, mapping=dict(enumerate(rules)))
    for name, (kind, spec, names) in (bundles or {}).items():
        batch.pipe.hset(keys.bundles, name, json.dumps({"kind": kind, "spec": spec, "keys": names}))
    batch.add(0, len(readers) + len(plan.persisted) + len(rules))
    # Big constants (a data set) also go to a sealed file local workers map instead of reading the chunks
    # (same_host), written on a thread while the others are sent; the chunks of those that got one are sent after
    # the graph's start (background_upload), the rest now. Not those whose loops stream them (row_stream): local
    # workers read those from the store as they train, and the host holds them twice, not three times.
    streamed = row_stream.streamed_constants(plan)
    big = {node_id: t for node_id, t in constants.items() if t.nbytes > chunk and node_id not in streamed}
    references = same_host.start_writing(keys.token, {keys.tensor(i): t for i, t in big.items()})
    later = {node_id: t for node_id, t in big.items() if node_id not in persisted}
    _send(batch, keys, {node_id: t for node_id, t in constants.items() if node_id not in later}, chunk)
    files = references()
    for key, reference in files.items():
        batch.pipe.set(key, reference)
    deferred = []
    for node_id, tensor in later.items():
        file = files.get(same_host.reference_key(keys.tensor(node_id)))
        if file is None:   # no file (its memory refused, or the path off): its chunks go now
            _send(batch, keys, {node_id: tensor}, chunk)
        else:
            deferred.append(background_upload.deferred(batch.pipe, keys.tensor(node_id), tensor, chunk, file))
    if meta.get("spot"):   # the policy the SPOT script and this requester read: not the meta, which workers write
        batch.pipe.set(keys.policy, meta["spot"])
    if int(meta.get("verify") or 1) > 1 or meta.get("spot"):   # what each voter reads is what was uploaded
        seals.record_constants(batch.pipe, keys, {i: t for i, t in constants.items() if i not in streamed})
    now = time.time()
    batch.pipe.hset(keys.meta, mapping={
        **meta, "state": graph_states.ACTIVATED, "seed": plan.seed, "devices": ",".join(sorted(devices)),
        "roots": ",".join(map(str, roots)), "n_subgraphs": len(plan.subgraphs), "done_subgraphs": 0,
        "n_ops": n_ops, "ops_done": 0, "n_steps": plan.n_steps, "created": now})
    batch.pipe.zadd(token_keys.graphs, {plan.graph_id: now})
    batch.pipe.set(token_keys.current, plan.graph_id)
    batch.send()
    background_upload.start(client, keys, deferred, lambda error: fail_watched(client, keys, error))
    return keys


def _send(batch: _Batcher, keys: GraphKeys, constants: Mapping[int, "torch.Tensor"], chunk: int) -> None:
    """Queue `constants` on `batch`, sending it every BATCH_BYTES (also within one big tensor: the bar moves)."""
    if not constants:
        return
    from ..core import progress   # tqdm, 30 ms more for the commands that read only
    from . import tensors   # loads torch: see the module's docstring
    with progress.bar(sum(t.nbytes for t in constants.values()), "uploading constants", unit="B",
                      unit_scale=True) as uploaded:
        def queued(size: int) -> None:
            uploaded.update(size)
            batch.add(size)
        for node_id, tensor in constants.items():
            tensors.write(batch.pipe, keys.tensor(node_id), tensor, chunk, queued=queued)


# The meta fields a tracker reads (not the plan-sized ones: roots, summary).
STATE_FIELDS = ("name", "state", "ops_done", "n_ops", "devices", "error", "error_op", "error_source",
                "error_worker", "error_subgraph", "approach", "n_steps", "cancelled_by", "stop", "stopped")


def read_state(client: Client, keys: GraphKeys) -> Dict[str, str]:
    """The graph's STATE_FIELDS as a str dict (one HMGET; queue it on a pipeline and pass the reply to
    `decode_state` to combine it with other reads); {} if the graph is not in Redis."""
    return decode_state(client.hmget(keys.meta, STATE_FIELDS))


def decode_state(values: Sequence[Optional[bytes]]) -> Dict[str, str]:
    if values[1] is None:
        return {}
    return {field: value.decode() for field, value in zip(STATE_FIELDS, values) if value is not None}


def steps_done(client: Client, keys: GraphKeys) -> int:
    """Loop steps run so far, over all the graph's loops."""
    return sum(int(v) for v in client.hvals(keys.steps))


def describe_failure(meta: Mapping[str, str]) -> str:
    """One line naming the op, its source line, the worker and the error of a failed graph; who cancelled a
    cancelled one, and why."""
    if meta.get("state") == graph_states.CANCELLED:
        return (f"graph {meta.get('name', '?')!r} was cancelled by {meta.get('cancelled_by') or 'its requester'}: "
                f"{meta.get('error') or 'no reason given'}")
    error = meta.get("error", "unknown error")
    if not meta.get("error_op") and meta.get("error_subgraph") == "" and not meta.get("error_worker"):
        return f"graph {meta.get('name', '?')!r} failed: {error}"   # the requester's own failure (an upload)
    op = f"op {meta['error_op']!r}" if meta.get("error_op") else f"subgraph {meta.get('error_subgraph', '?')}"
    where = f" (recorded at {meta['error_source']})" if meta.get("error_source") else ""
    worker = f" on worker {meta['error_worker']}" if meta.get("error_worker") else ""
    return f"graph {meta.get('name', '?')!r} failed: {op}{where}{worker}: {error}"


def list_graphs(client: Client, token: str) -> List[Dict[str, Any]]:
    """The token's graphs, oldest first: id, name, algorithm, state, progress (percent of ops run, or of loop
    steps for a graph with training loops), ops, subgraphs, the Unix times created, started and finished
    (None until then), and `stopped`: where a stop request ended its training early, in words (else None)."""
    ids = [gid.decode() for gid in client.zrange(TokenKeys(token).graphs, 0, -1)]
    pipe = client.pipeline(transaction=False)
    fields = ("name", "algorithm", "state", "ops_done", "n_ops", "n_subgraphs", "created", "started", "finished",
              "n_steps", "approach", "rules", "stopped")
    for gid in ids:
        keys = GraphKeys(token, gid)
        pipe.hmget(keys.meta, *fields)
        pipe.hvals(keys.steps)
    replies = pipe.execute()
    graphs = []
    for gid, values, steps in zip(ids, replies[::2], replies[1::2]):
        if values[0] is None:
            continue  # deleted since it was listed
        started, finished = (None if v is None else float(v) for v in values[7:9])
        name, algorithm, state, ops_done, n_ops, n_subgraphs, created = (v.decode() for v in values[:7])
        approach, rules = (v.decode() if v is not None else "" for v in values[10:12])
        n_ops, ops_done = int(n_ops), int(ops_done)
        n_steps = int(values[9] or 0)
        if n_steps:  # a training graph's time is its loop steps: count those
            ops_done, n_ops = sum(int(v) for v in steps), n_steps
        progress = 100.0 if state == graph_states.DONE else round(100.0 * ops_done / n_ops, 1) if n_ops else 0.0
        graphs.append({"id": gid, "name": name, "algorithm": algorithm, "approach": approach,
                       "rules": json.loads(rules) if rules else None, "state": state, "progress": progress,
                       "ops": n_ops, "subgraphs": int(n_subgraphs), "created": float(created),
                       "started": started, "finished": finished,
                       "stopped": values[12].decode() if values[12] is not None else None})
    return graphs


def _if_live(client: Client, keys: GraphKeys, write: Callable[[Any, str], None], unless: str = "") -> bool:
    """`write(pipeline, now)` as one optimistic transaction on the graph's meta if the graph is activated or
    running (and its meta has no field `unless`): the requester's side of the CANCEL and STOP scripts
    (ravop.store.scripts) for a `ravop admin` token user, who runs no scripts. True if the graph is live, False
    if it had already ended."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(keys.meta)
                state, present = pipe.hmget(keys.meta, "state", unless or "state")
                if state not in {s.encode() for s in graph_states.LIVE}:
                    return False
                if unless and present is not None:
                    return True
                seconds, micros = pipe.time()
                pipe.multi()
                write(pipe, f"{seconds}.{micros:06d}")
                pipe.execute()
                return True
            except redis.WatchError:
                continue


def _end_watched(client: Client, keys: GraphKeys, state: str, fields: Mapping[str, str]) -> bool:
    def write(pipe: Any, now: str) -> None:
        pipe.hset(keys.meta, mapping={"state": state, "finished": now, "error_op": "", "error_source": "",
                                      "error_worker": "", "error_subgraph": "", **fields})
        pipe.xadd(keys.events, {"state": state}, maxlen=16, approximate=True)
    return _if_live(client, keys, write)


def cancel_watched(client: Client, keys: GraphKeys, error: str, by: str) -> bool:
    """Cancel a live graph as the CANCEL script does, naming who cancelled it (`by`)."""
    return _end_watched(client, keys, graph_states.CANCELLED, {"error": error, "cancelled_by": by})


def fail_watched(client: Client, keys: GraphKeys, error: str) -> bool:
    """Fail a live graph as the CANCEL script does, for a failure of the requester's own (no op, no worker: a
    constant's upload, ravop.store.background_upload)."""
    return _end_watched(client, keys, graph_states.FAILED, {"error": error})


def stop_watched(client: Client, keys: GraphKeys, why: str, by: str) -> bool:
    """Ask a live graph's loops to stop as the STOP script does (the first request is kept)."""
    return _if_live(client, keys, lambda pipe, now: pipe.hset(keys.meta, mapping={"stop": why, "stop_by": by}),
                    unless="stop")
