"""The requester's session: connect, upload a compiled graph, start it, follow it, fetch its results."""
import json
import os
import time

import redis

from . import store
from .errors import (ConnectionFailed, GraphFailedError, GraphStateError, NotComputedError,
                     UnknownPersistName)
from .graph import current_graph
from .store import GraphKeys
from .wire import decode_tensor, encode_tensor

# Loaders of persisted bundles (trained models): kind -> fn(spec, {key: tensor}) -> object. ravdl registers.
LOADERS = {}


class _Session:
    client = None
    token = None
    url = None
    embedded = None


_session = _Session()


def initialize(token=None, redis_url=None, workers=None, **worker_options):
    """Connect to Redis (`redis_url` or $RAVOP_REDIS_URL), or start the embedded server and `workers` local
    workers (default 2, or $RAVOP_WORKERS). `token` names the requester and namespaces its graphs."""
    url = redis_url or os.environ.get("RAVOP_REDIS_URL")
    _session.token = token or os.environ.get("RAVOP_TOKEN", "local")
    if url:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, health_check_interval=30)
        try:
            client.ping()
        except (redis.RedisError, OSError) as exc:
            raise ConnectionFailed(f"cannot reach Redis at {url}: {exc}") from None
        _session.client, _session.url = client, url
    else:
        if _session.embedded is None:
            from .embedded import EmbeddedCluster
            count = workers if workers is not None else int(os.environ.get("RAVOP_WORKERS", "2"))
            extra = [a for k, v in worker_options.items() for a in (f"--{k.replace('_', '-')}", str(v))]
            _session.embedded = EmbeddedCluster(count, extra)
        _session.client, _session.url = _session.embedded.client, _session.embedded.url
    store.ensure_groups(_session.client)
    return _session.url


def _client():
    if _session.client is None:
        initialize()
    return _session.client


def _current_keys():
    client = _client()
    graph = current_graph()
    if graph.activated:
        return GraphKeys(_session.token, graph.id)
    gid = client.get(store.token_key(_session.token, "current"))
    if gid is None:
        raise GraphStateError("no graph has been activated for this token: record ops, then R.activate()")
    return GraphKeys(_session.token, gid.decode())


def flush():
    """Delete this token's graphs, tensors and persisted values (idempotent), and start a fresh graph."""
    client = _client()
    keys = list(client.scan_iter(match=f"ravop:{_session.token}:*", count=1000))
    for start in range(0, len(keys), 1000):
        client.unlink(*keys[start:start + 1000])
    from .graph import Graph
    Graph(name="default")


def activate():
    """Compile the current graph, upload it, and return a summary. No ops may be added afterwards."""
    from compiler import compile_graph
    graph = current_graph()
    graph.check_open()
    client = _client()
    compiled = compile_graph(graph)
    plan = compiled.plan
    keys = GraphKeys(_session.token, graph.id)
    device = "cuda" if graph.gpu_required else "cpu"
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.meta, mapping={"name": graph.name, "algorithm": graph.algorithm, "state": "activated",
                                  "n_subgraphs": len(plan.subgraphs), "done": 0, "ops_done": 0,
                                  "n_ops": sum(len(s.nodes) for s in plan.subgraphs), "seed": plan.seed,
                                  "device": device, "created": time.time()})
    for sub in plan.subgraphs:
        pipe.hset(keys.plan, sub.id, sub.SerializeToString())
        pipe.hset(keys.deps, sub.id, sub.n_predecessors)
    if plan.persisted:
        pipe.hset(keys.persist, mapping=dict(plan.persisted))
    for name, (kind, spec, names) in graph.bundles.items():
        pipe.hset(keys.bundles, name, json.dumps({"kind": kind, "spec": spec, "keys": names}))
    pipe.execute()
    _upload_constants(client, keys, compiled.constants)
    client.set(store.token_key(_session.token, "current"), graph.id)
    client.rpush(store.token_key(_session.token, "graphs"), graph.id)
    graph.activated = True
    return compiled.summary


def _upload_constants(client, keys, constants, batch_bytes=64 * 2**20):
    """Pipelined in batches so a large model neither makes one huge request nor one round trip per tensor."""
    pipe, pending = client.pipeline(transaction=False), 0
    for node_id, tensor in constants.items():
        data = encode_tensor(tensor)
        pipe.set(keys.tensor(node_id), data)
        pending += len(data)
        if pending >= batch_bytes:
            pipe.execute()
            pending = 0
    pipe.execute()


def execute():
    """Start the activated graph: enqueue every subgraph that waits for nothing."""
    graph = current_graph()
    if not graph.activated:
        raise GraphStateError("R.execute() needs an activated graph: call R.activate() first")
    client = _client()
    keys = GraphKeys(_session.token, graph.id)
    stream = store.queue("cuda" if graph.gpu_required else "cpu")
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.meta, "state", "running")
    roots = [sg_id for sg_id, n in client.hgetall(keys.deps).items() if int(n) == 0]
    for sg_id in roots:
        pipe.xadd(stream, {"token": _session.token, "graph": graph.id, "sg": sg_id})
    if not client.hlen(keys.plan):
        pipe.hset(keys.meta, "state", "done")  # everything was folded into constants
    pipe.execute()


def _meta(keys):
    meta = _client().hgetall(keys.meta)
    if not meta:
        raise GraphStateError(f"graph {keys.graph_id} is not in Redis (flushed?)")
    return {k.decode(): v.decode() for k, v in meta.items()}


def _raise_if_failed(meta):
    if meta.get("state") == "failed":
        raise GraphFailedError(store.describe_error(meta.get("error")))


def track_progress(timeout=None, poll=0.05, progress_bar=True):
    """Show progress until the graph is done; raise `GraphFailedError` if it failed, `TimeoutError` after
    `timeout` seconds. Reports "waiting for a GPU worker" while GPU work has no worker to run it."""
    from tqdm import tqdm
    keys = _current_keys()
    meta = _meta(keys)
    total = int(meta.get("n_ops", 0))
    deadline = None if timeout is None else time.monotonic() + timeout
    with tqdm(total=total, unit="op", disable=not progress_bar, desc=meta.get("name")) as bar:
        while True:
            meta = _meta(keys)
            bar.update(int(meta.get("ops_done", 0)) - bar.n)
            _raise_if_failed(meta)
            if meta.get("state") == "done":
                return meta
            if meta.get("state") == "activated":
                raise GraphStateError("the graph is activated but not started: call R.execute()")
            if meta.get("device") == "cuda" and not _workers_alive("cuda"):
                bar.set_postfix_str("waiting for a GPU worker")
            if deadline is not None and time.monotonic() > deadline:
                waiting = " (no GPU worker is running)" if meta.get("device") == "cuda" and \
                    not _workers_alive("cuda") else ""
                raise TimeoutError(f"graph {meta.get('name')!r} not done after {timeout} s: "
                                   f"{meta.get('ops_done')}/{total} ops{waiting}")
            time.sleep(poll)


def _workers_alive(kind):
    return any(True for _ in _client().scan_iter(match=store.worker_key(kind, "*"), count=100))


def fetch_persisting_op(op_name, wait=False, timeout=None):
    """The value persisted under `op_name` as a `torch.Tensor` (or, for a saved model, the model).

    Not computed yet: `NotComputedError`, or with `wait=True` wait for it (up to `timeout` seconds)."""
    keys = _current_keys()
    client = _client()
    bundle = client.hget(keys.bundles, op_name)
    if bundle is not None:
        info = json.loads(bundle)
        tensors = {key: fetch_persisting_op(name, wait, timeout) for key, name in info["keys"].items()}
        loader = LOADERS.get(info["kind"])
        if loader is None:
            raise GraphStateError(f"no loader for saved object kind {info['kind']!r} (import the package "
                                  "that saved it, e.g. ravdl)")
        return loader(info["spec"], tensors)
    node_id = client.hget(keys.persist, op_name)
    if node_id is None:
        names = sorted(n.decode() for n in client.hkeys(keys.persist))
        shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")
        raise UnknownPersistName(f"no op persisted as {op_name!r} in graph {keys.graph_id}; persisted: "
                                 f"{shown or 'none'}")
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        raw = client.get(keys.tensor(int(node_id)))
        if raw is not None:
            return decode_tensor(raw)
        meta = _meta(keys)
        _raise_if_failed(meta)
        if not wait:
            raise NotComputedError(f"{op_name!r} is not computed yet (graph state: {meta.get('state')}); "
                                   "call R.track_progress() first or pass wait=True")
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{op_name!r} still not computed after {timeout} s")
        time.sleep(0.05)


def get_my_graphs():
    """This token's graphs: id, name, state and progress, oldest first."""
    client = _client()
    graphs = []
    for gid in client.lrange(store.token_key(_session.token, "graphs"), 0, -1):
        meta = client.hgetall(GraphKeys(_session.token, gid.decode()).meta)
        if meta:
            meta = {k.decode(): v.decode() for k, v in meta.items()}
            graphs.append({"id": gid.decode(), "name": meta.get("name"), "state": meta.get("state"),
                           "subgraphs": int(meta.get("n_subgraphs", 0)),
                           "progress": f"{meta.get('ops_done', 0)}/{meta.get('n_ops', 0)} ops"})
    return graphs
