"""The requester's session: R.initialize, R.flush, R.activate, R.execute, R.track_progress,
R.fetch_persisting_op and R.get_my_graphs.

A session is a Redis connection and a token. Everything about a graph lives in Redis under the token
(`ravop.store.keys`), so the requester may exit after R.execute(): another process that calls
R.initialize(same token, same URL) finds the token's current graph and can track and fetch it.
"""
import json
import os
import sys
import time

import redis

from .errors import ConnectionFailed, GraphFailedError, GraphStateError, NotComputedError, UnknownPersistName
from .fetched import fetched
from .graph import current_graph, set_current
from .store import GraphKeys, Scripts, TokenKeys, connect, ensure_queues, token_namespace
from .store.connect import redact
from .store import graphs as store_graphs
from .store import workers as liveness
from .wire import decode_tensor

# How a persisted bundle (a trained model) is rebuilt at fetch: kind -> fn(spec, {key: tensor}) -> object.
# Packages that save bundles (ravdl) register their kinds here.
LOADERS = {}

DEFAULT_TOKEN = "local"
DEFAULT_WORKERS = 2
POLL_SECONDS = 0.2    # how often a tracker refreshes the progress bar
WAIT_SECONDS = 0.05   # how often fetch_persisting_op(wait=True) looks for the value


class Session:
    def __init__(self, client, url, token, embedded=None):
        self.client, self.url, self.token, self.embedded = client, url, token, embedded
        self.scripts = Scripts(client)
        current = client.get(TokenKeys(token).current)
        self.graph_id = current.decode() if current else None
        # persist name -> node id of the graph this session activated: fetching one of its values then
        # skips the name lookup in Redis (one round trip instead of two; fetching each batch loss of a
        # training run adds up). Saved objects (bundles) still go through Redis.
        self.activated_names = {}

    def keys(self):
        if self.graph_id is None:
            raise GraphStateError(f"no graph has been activated under token {self.token!r}: record ops, "
                                  "persist_op() the values to fetch, then R.activate()")
        return GraphKeys(self.token, self.graph_id)

    def close(self):
        self.client.close()
        if self.embedded is not None:
            self.embedded.stop()


_session = None


def initialize(token=None, redis_url=None, workers=None, device="cpu", timeout=5.0, ravenverse_token=None):
    """Connect to Redis at `redis_url` (or $RAVOP_REDIS_URL); with neither, start the embedded default: a
    private server and `workers` local worker processes on `device` (default $RAVOP_WORKERS or 2).

    `token` (or the original's `ravenverse_token=`; default $RAVOP_TOKEN or "local") names the requester and
    namespaces its graphs and results: a token that is not a short name is a secret of any length, and only
    a digest of it is used (`ravop.store.keys.token_namespace`). An unreachable URL raises `ConnectionFailed`
    within about `timeout` seconds."""
    global _session
    if token is not None and ravenverse_token is not None and token != ravenverse_token:
        raise ValueError("initialize() got two different tokens (token= and ravenverse_token=): give one")
    token = token_namespace(token or ravenverse_token or os.environ.get("RAVOP_TOKEN") or DEFAULT_TOKEN)
    url = redis_url or os.environ.get("RAVOP_REDIS_URL")
    embedded = None
    if url:
        client = connect(url, timeout)
    elif _session is not None and _session.embedded is not None:
        embedded, url, client = _session.embedded, _session.url, _session.client  # keep the running one
    else:
        from .embedded import EmbeddedCluster, default_data_dir
        count = workers if workers is not None else int(os.environ.get("RAVOP_WORKERS", DEFAULT_WORKERS))
        embedded = EmbeddedCluster(count, device, data_dir=default_data_dir())
        url = embedded.url
        try:
            client = connect(url, timeout)
        except ConnectionFailed:
            embedded.stop()
            raise
    if _session is not None and _session.client is not client:
        _session.close()
    ensure_queues(client)
    _session = Session(client, url, token, embedded)
    return _session


def _require():
    if _session is None:
        raise GraphStateError("no session: call R.initialize() first (no arguments starts a local engine)")
    return _session


def _client():
    return _require().client


def _current_keys():
    return _require().keys()


def flush():
    """Delete this token's graphs, tensors and persisted values (idempotent; other tokens are untouched), and
    start recording a fresh graph."""
    session = _require()
    store_graphs.delete_token(session.client, session.token)
    session.graph_id = None
    session.activated_names = {}
    set_current(None)


class Summary(dict):
    """What R.activate() returns: the compiler's counts, printed as one line."""

    def __str__(self):
        return (f"graph {self['name']!r} ({self['graph_id']}): {self['recorded_ops']} ops recorded, "
                f"{self['compiled_ops']} to run in {self['subgraphs']} subgraphs, ~{self['flops']:.3g} FLOPs, "
                f"up to {self['max_parallel_width']} subgraphs at once")


def activate(**compile_options):
    """Compile the current graph and upload it; no ops may be added to it afterwards. Returns a `Summary`
    (ops, subgraphs, estimated FLOPs, max parallel width). `compile_options` go to `compiler.compile_graph`
    (e.g. max_subgraph_seconds)."""
    session = _require()
    graph = current_graph()
    graph.check_open()
    if not graph.persisted:
        raise GraphStateError(f"graph {graph.name!r} persists no op, so there is nothing to compute: call "
                              "op.persist_op(name) on the values to fetch, then R.activate()")
    from compiler import compile_graph  # ravop depends on the compiler only here (DESIGN.md)
    compiled = compile_graph(graph, **compile_options)
    summary = Summary(name=graph.name, graph_id=graph.id, **compiled.summary)
    meta = {"name": graph.name, "algorithm": graph.algorithm, "approach": graph.approach,
            "rules": json.dumps(graph.rules), "summary": json.dumps(summary)}
    store_graphs.upload(session.client, session.token, compiled.plan, compiled.constants, meta, graph.bundles)
    graph.activated = True
    session.graph_id = graph.id
    session.activated_names = {name: node_id for name, node_id in compiled.plan.persisted.items()
                               if name not in graph.bundles}
    return summary


def execute(participants=None):
    """Start the activated graph: enqueue its subgraphs that wait for nothing. Idempotent.

    `participants` is the original's number of providers to compute the graph: here the graph runs on the
    workers that are connected, as many as it has parallel work for; if fewer than `participants` are
    connected, execute() says so."""
    if participants is not None and (type(participants) is not int or participants < 1):
        raise ValueError(f"participants must be a positive int, not {participants!r}")
    session = _require()
    graph = current_graph()
    if graph.nodes and not graph.activated:
        raise GraphStateError(f"graph {graph.name!r} is not activated: call R.activate() first")
    keys = session.keys()
    try:
        session.scripts.start(keys)
    except redis.ResponseError as exc:
        if "NOGRAPH" in str(exc):
            raise GraphStateError(f"graph {keys.graph_id} is no longer in Redis (flushed?)") from None
        raise
    if participants is not None:
        if session.embedded is not None:
            session.embedded.wait_ready(session.client)
        meta = _meta(session, keys)
        kinds = [k for k in meta.get("devices", "").split(",") if k]
        connected = sum(len(liveness.alive(session.client, kind)) for kind in kinds)
        if connected < participants:
            print(f"graph {meta['name']!r}: {connected} worker(s) connected, fewer than participants="
                  f"{participants}; it runs on those, and on any that connect later", file=sys.stderr)


def _meta(session, keys):
    meta = store_graphs.read_state(session.client, keys)
    if not meta:
        raise GraphStateError(f"graph {keys.graph_id} of token {session.token!r} is no longer in Redis (flushed?)")
    return meta


def _failed(meta):
    error = GraphFailedError(store_graphs.describe_failure(meta))
    error.op, error.error, error.worker = meta.get("error_op"), meta.get("error"), meta.get("error_worker")
    error.source, error.subgraph = meta.get("error_source"), meta.get("error_subgraph")
    return error


def _missing_workers(session, meta):
    """Device kinds this graph needs that no live worker serves."""
    kinds = [k for k in meta.get("devices", "").split(",") if k]
    return [kind for kind in kinds if not liveness.alive(session.client, kind)]


def _waiting_text(kinds):
    return ", ".join(f"waiting for a {'GPU' if kind == 'cuda' else 'CPU'} worker" for kind in kinds)


def track_progress(progress_bar=True, timeout=None):
    """Show a progress bar (ops run) until the graph is done. Raises `GraphFailedError` (op, error, worker,
    source line) if it failed, `TimeoutError` after `timeout` seconds. While work waits for a kind of worker
    that nobody runs, says so ("waiting for a GPU worker") instead of waiting silently."""
    from tqdm import tqdm
    session = _require()
    keys = session.keys()
    meta = _meta(session, keys)
    if meta["state"] == "activated":
        raise GraphStateError(f"graph {meta['name']!r} has not been started: call R.execute()")
    if session.embedded is not None:
        session.embedded.wait_ready(session.client)
    deadline = None if timeout is None else time.monotonic() + timeout
    last_event, warned, next_check = "0-0", set(), 0.0
    with tqdm(total=int(meta["n_ops"]), unit="op", desc=meta["name"], disable=not progress_bar,
              file=sys.stderr) as bar:
        while True:
            meta = _meta(session, keys)
            bar.update(int(meta["ops_done"]) - bar.n)
            if meta["state"] == "done":
                return
            if meta["state"] == "failed":
                raise _failed(meta)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 1.0
                if session.embedded is not None:
                    session.embedded.check()
                missing = _missing_workers(session, meta)
                if set(missing) - warned:
                    warned |= set(missing)
                    print(f"graph {meta['name']!r}: {_waiting_text(missing)} (none is connected to "
                          f"{redact(session.url)})", file=sys.stderr)
                bar.set_postfix_str(_waiting_text(missing))
            if deadline is not None and now >= deadline:
                missing = _missing_workers(session, meta)
                why = "; " + ", ".join(f"no {'GPU' if k == 'cuda' else 'CPU'} worker is running" for k in missing) \
                    if missing else ""
                raise TimeoutError(f"graph {meta['name']!r} is not done after {timeout} s: {meta['ops_done']} of "
                                   f"{meta['n_ops']} ops run{why}")
            wait = POLL_SECONDS if deadline is None else max(0.001, min(POLL_SECONDS, deadline - now))
            # Blocks until the graph ends (its events stream gets an entry) or the next refresh is due.
            for _, entries in session.client.xread({keys.events: last_event}, block=int(wait * 1000)) or ():
                last_event = entries[-1][0]


def fetch_persisting_op(op_name, wait=False, timeout=None):
    """The value persisted under `op_name`, as a torch.Tensor that also answers the original's
    `['result']` (`ravop.fetched`; for a saved model, the object its loader builds). A value not computed
    yet raises `NotComputedError`, or with `wait=True` is waited for (up to
    `timeout` seconds); an unknown name raises `UnknownPersistName`; a failed graph `GraphFailedError`."""
    session = _require()
    keys = session.keys()
    deadline = None if timeout is None else time.monotonic() + timeout
    node_id = session.activated_names.get(op_name)
    if node_id is not None:
        return fetched(_fetch_tensor(session, keys, op_name, node_id, wait, deadline))
    pipe = session.client.pipeline(transaction=False)
    pipe.hget(keys.persist, op_name)
    pipe.hget(keys.bundles, op_name)
    node_id, bundle = pipe.execute()
    if bundle is not None:
        info = json.loads(bundle)
        loader = LOADERS.get(info["kind"])
        if loader is None:
            raise GraphStateError(f"{op_name!r} is a saved {info['kind']!r} object and no loader is registered "
                                  "for that kind: import the package that saved it (e.g. ravdl.v2)")
        tensors = {}
        for key, name in info["keys"].items():
            tensors[key] = _fetch_tensor(session, keys, name, session.client.hget(keys.persist, name), wait,
                                         deadline)
        return loader(info["spec"], tensors)
    if node_id is None:
        meta = _meta(session, keys)
        names = sorted(n.decode() for n in session.client.hkeys(keys.persist))
        shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
        raise UnknownPersistName(f"no op was persisted as {op_name!r} in graph {meta['name']!r} "
                                 f"({keys.graph_id}); persisted names: {shown or 'none'}")
    return fetched(_fetch_tensor(session, keys, op_name, node_id, wait, deadline))


def _fetch_tensor(session, keys, name, node_id, wait, deadline):
    if node_id is None:
        raise UnknownPersistName(f"persist name {name!r} is missing from graph {keys.graph_id}")
    key = keys.tensor(int(node_id))
    while True:
        pipe = session.client.pipeline(transaction=False)
        pipe.get(key)
        pipe.hmget(keys.meta, store_graphs.STATE_FIELDS)
        data, meta = pipe.execute()
        if data is not None:
            return decode_tensor(data)
        meta = store_graphs.decode_state(meta)
        if not meta:
            raise GraphStateError(f"graph {keys.graph_id} is no longer in Redis (flushed?)")
        if meta["state"] == "failed":
            raise _failed(meta)
        if meta["state"] == "done":
            raise GraphStateError(f"graph {meta['name']!r} is done but {name!r} is not in Redis")
        if not wait:
            raise NotComputedError(f"{name!r} is not computed yet: graph {meta['name']!r} is {meta['state']} "
                                   f"({meta['ops_done']} of {meta['n_ops']} ops run). R.track_progress() waits for "
                                   "the whole graph; fetch_persisting_op(name, wait=True) waits for this value")
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"{name!r} is still not computed: graph {meta['name']!r} is {meta['state']} "
                               f"({meta['ops_done']} of {meta['n_ops']} ops run)")
        if session.embedded is not None:
            session.embedded.check()
        time.sleep(WAIT_SECONDS)


def get_my_graphs(show=True):
    """This token's graphs, oldest first: dicts with id, name, algorithm, approach, rules, state, progress
    (percent of ops run), ops, subgraphs and created (Unix time). With `show`, also prints them as the
    original's table (Id, Name, Approach, Algorithm, Rules, Status)."""
    session = _require()
    graphs = store_graphs.list_graphs(session.client, session.token)
    if show:
        print(graphs_table(graphs))
    return graphs


def graphs_table(graphs):
    header = ("Id", "Name", "Approach", "Algorithm", "Rules", "Status")
    rows = [(g["id"], g["name"], g["approach"], g["algorithm"], "" if g["rules"] is None else json.dumps(g["rules"]),
             f"{g['state']} ({g['progress']:g}%)") for g in graphs]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    text = [line, "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |", line]
    text += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(text + ([line] if rows else []) + ([] if rows else ["(no graphs)"]))
