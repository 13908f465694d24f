"""The requester's session: R.initialize, R.flush, R.activate, R.execute, R.track_progress,
R.fetch_persisting_op and R.get_my_graphs.

A session is a Redis connection and a token. Everything about a graph lives in Redis under the token
(`ravop.store.keys`), so the requester may exit after R.execute(): another process that calls
R.initialize(same token, same URL) finds the token's current graph and can track and fetch it.
"""
import gc
import json
import os
import sys
import time

import redis

from .errors import ConnectionFailed, GraphFailedError, GraphStateError, NotComputedError, UnknownPersistName
from . import last_session, parallel, progress
from .federated import session as federated
from .fetched import fetched
from .graph import current_graph, set_current
from .store import GraphKeys, Scripts, TokenKeys, connect, ensure_queues, token_namespace
from .store.connect import Outage, redact, url_user
from .store.handoff import Handoff
from .store import graphs as store_graphs
from .store import tensors as stored
from .store.federated import FederatedKeys
from .store import worker_info
from .store import workers as liveness

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
        self.handoff = Handoff(client, Scripts(client))
        current = client.get(TokenKeys(token).current)
        self.graph_id = current.decode() if current else None
        # persist name -> node id of the graph this session activated: fetching one of its values then
        # skips the name lookup in Redis (one round trip instead of two; fetching each batch loss of a
        # training run adds up). Saved objects (bundles) still go through Redis.
        self.activated_names = {}
        self.dashboard = None  # a ravop.dashboard.Dashboard serving this session, with dashboard=True

    def keys(self):
        if self.graph_id is None:
            raise GraphStateError(f"no graph has been activated under token {self.token!r}: record ops, "
                                  "persist_op() the values to fetch, then R.activate()")
        return GraphKeys(self.token, self.graph_id)

    def close(self):
        if self.dashboard is not None:
            self.dashboard.stop()
        self.client.close()
        if self.embedded is not None:
            self.embedded.stop()


_session = None


def initialize(token=None, redis_url=None, workers=None, device="cpu", timeout=5.0, data=None, dashboard=False,
               ravenverse_token=None):
    """Connect to Redis at `redis_url` (or $RAVOP_REDIS_URL); with neither, start the embedded default: a
    private server and `workers` local worker processes on `device` (default $RAVOP_WORKERS or 2).

    `data` (default $RAVOP_DATA, paths separated by os.pathsep) makes embedded workers data providers for
    federated graphs: one provider per entry, each a file path or a list of paths (CSV or Parquet).

    `token` (or the original's `ravenverse_token=`; default $RAVOP_TOKEN, else the user named in the URL (a
    `ravop admin token` user), else "local") names the requester and
    namespaces its graphs and results: a token that is not a short name is a secret of any length, and only
    a digest of it is used (`ravop.store.keys.token_namespace`). An unreachable URL raises `ConnectionFailed` within about `timeout` seconds. `dashboard=True` (or a port
    number) serves the read-only web dashboard of this session on 127.0.0.1 and prints its URL."""
    global _session
    if gc.get_freeze_count() == 0:
        # Recording allocates one tracked object per op; without this, each full garbage collection would also
        # walk the hundreds of thousands of objects torch creates at import, doubling the cost of recording an op.
        # Once only: a later call would also freeze the user's graphs so far, and their cycles would never be freed.
        gc.freeze()
    if not isinstance(dashboard, (bool, int)) or (dashboard is not True and dashboard is not False
                                                  and not 0 < dashboard < 65536):
        raise ValueError(f"dashboard must be True, False or a port number, not {dashboard!r}")
    if token is not None and ravenverse_token is not None and token != ravenverse_token:
        raise ValueError("initialize() got two different tokens (token= and ravenverse_token=): give one")
    url = redis_url or os.environ.get("RAVOP_REDIS_URL")
    token = token_namespace(token or ravenverse_token or os.environ.get("RAVOP_TOKEN") or (url and url_user(url))
                            or DEFAULT_TOKEN)
    data = _provider_data(data if data is not None else os.environ.get("RAVOP_DATA"))
    embedded = None
    if url:
        if data:
            raise ValueError("data= (or $RAVOP_DATA) gives the embedded workers data; on a cluster each provider "
                             "runs ravop-worker --data PATH")
        client = connect(url, timeout)
    elif _session is not None and _session.embedded is not None and _session.embedded.data == data:
        embedded, url, client = _session.embedded, _session.url, _session.client  # keep the running one
    else:
        from .embedded import EmbeddedCluster, default_data_dir
        count = workers if workers is not None else max(int(os.environ.get("RAVOP_WORKERS", DEFAULT_WORKERS)),
                                                        len(data))
        if count < len(data):
            raise ValueError(f"data= names {len(data)} providers but workers={count}: each provider is a worker")
        embedded = EmbeddedCluster(count, device, data=data, data_dir=default_data_dir())
        url = embedded.url
        try:
            client = connect(url, timeout)
        except ConnectionFailed:
            embedded.stop()
            raise
    if _session is not None and _session.client is not client:
        _session.close()
    elif _session is not None and _session.dashboard is not None:
        _session.dashboard.stop()  # the new session serves its own dashboard, or none
    try:
        ensure_queues(client)
        _session = Session(client, url, token, embedded)
    except redis.exceptions.NoPermissionError:
        client.close()
        _session = None
        raise ConnectionFailed(f"the Redis user of {redact(url)} may not use token {token!r}: a `ravop admin token` "
                               "user may use only its own token (leave token= out to use it)") from None
    if embedded is not None:
        last_session.remember(url, token)  # `ravop status` in another terminal finds it
    if dashboard is not False:
        from .dashboard import Dashboard  # the web server is loaded only when asked for
        _session.dashboard = Dashboard(client, token, port=0 if dashboard is True else dashboard).start()
        print(f"ravop dashboard: {_session.dashboard.url}")
    return _session


def _provider_data(data):
    """[[path, ...] per provider] from data= or $RAVOP_DATA; missing files are named here, not by a worker."""
    if not data:
        return []
    entries = data.split(os.pathsep) if isinstance(data, str) else list(data)
    providers = [[str(entry)] if isinstance(entry, (str, os.PathLike)) else [str(p) for p in entry]
                 for entry in entries]
    missing = [path for paths in providers for path in paths if not os.path.isfile(path)]
    if missing:
        raise FileNotFoundError(f"provider data file(s) not found: {', '.join(missing)}")
    return providers


def _require():
    if _session is None:
        raise GraphStateError("no session: call R.initialize() first (no arguments starts a local engine)")
    return _session


def _client():
    return _require().client


def live_workers():
    """The live workers' advertisements on this session's server (`ravop.store.worker_info.read_all`)."""
    return worker_info.read_all(_client())


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
                f"up to {self['max_parallel_width']} subgraphs at once"
                + (f", {self['loop_steps']} loop steps" if self.get("loop_steps") else "")
                + (f", ~{self['estimated_handoff_seconds']:.2g} s of transfers between subgraphs"
                   if self.get("placement") else "")
                + "".join(f"\n{strategy}: " + (", ".join(f"{role} on {worker}" for role, worker in where.items())
                                               or "no live worker yet")
                          for strategy, where in self.get("placement", {}).items()))


def activate(**compile_options):
    """Compile the current graph and upload it; no ops may be added to it afterwards. Returns a `Summary`
    (ops, subgraphs, estimated FLOPs, max parallel width). `compile_options` go to `compiler.compile_graph`
    (e.g. max_subgraph_seconds)."""
    session = _require()
    graph = current_graph()
    graph.check_open()
    if session.embedded is not None:
        session.embedded.check_runs(graph)
    if graph.approach == "federated":
        summary = federated.activate(session, graph, compile_options)
        graph.activated = True
        session.graph_id, session.activated_names = graph.id, {}
        return summary
    if not graph.persisted and not graph.step_outputs:
        raise GraphStateError(f"graph {graph.name!r} persists no op, so there is nothing to compute: call "
                              "op.persist_op(name) on the values to fetch, then R.activate()")
    if graph.strategy is not None and not graph.parallel_fits:
        raise NotImplementedError(f"graph {graph.name!r} has strategy={graph.strategy!r} but no fit used it: a "
                                  "strategy applies to fit (NeuralNetwork, Functional, Pytorch_Model); hand-written "
                                  "training loops under a strategy are not implemented")
    from compiler import compile_graph  # ravop depends on the compiler only here (docs/architecture.md)
    from compiler.cost import calibrated
    workers = worker_info.read_all(session.client)   # their measured cost figures, and placement below
    compile_options.setdefault("devices", calibrated(workers))
    with progress.busy(f"compiling {graph.name!r} ({len(graph.nodes):,} ops)"):
        compiled = compile_graph(graph, **compile_options)
    summary = Summary(name=graph.name, graph_id=graph.id, **compiled.summary)
    if graph.parallel_fits:
        kind = "cuda" if graph.gpu_required else "cpu"   # the stream a worker of that kind reads
        summary["placement"] = {repr(s): parallel.forecast(s, workers, kind) for s in graph.parallel_fits}
    if graph.verify > 1 and compiled.plan.n_steps:
        raise GraphStateError(f"graph {graph.name!r} has training loops, which verify={graph.verify} does not "
                              "cover yet (a loop runs as a whole on one worker): leave verify= out")
    meta = {"name": graph.name, "algorithm": graph.algorithm, "approach": graph.approach,
            "rules": json.dumps(graph.rules), "summary": json.dumps(summary), "verify": graph.verify}
    store_graphs.upload(session.client, session.token, compiled.plan, compiled.constants, meta, graph.bundles)
    graph.activated = True
    session.graph_id = graph.id
    session.activated_names = {name: node_id for name, node_id in compiled.plan.persisted.items()
                               if name not in graph.bundles}
    return summary


def execute(timeout=None, participants=None):
    """Start the activated graph: enqueue its subgraphs that wait for nothing. Idempotent. With `timeout`,
    also wait until the graph is done, as `track_progress(progress_bar=False, timeout=timeout)` does:
    `GraphFailedError` if it failed, `TimeoutError` (naming a kind of worker nobody runs) after `timeout` s.

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
        session.handoff.start(keys)
    except redis.ResponseError as exc:
        if "NOGRAPH" in str(exc):
            raise GraphStateError(f"graph {keys.graph_id} is no longer in Redis (flushed?)") from None
        raise
    if session.client.hget(keys.meta, "approach") == b"federated":
        federated.open_to_providers(session.client, keys)
    copies = int(session.client.hget(keys.meta, "verify") or 1)
    if copies > 1:
        if session.embedded is not None:
            session.embedded.wait_ready(session.client)
        meta = _meta(session, keys)
        connected = sum(len(liveness.alive(session.client, k)) for k in meta.get("devices", "").split(",") if k)
        if connected < copies:
            print(f"graph {meta['name']!r}: verify={copies} runs each subgraph on {copies} different workers, but "
                  f"{connected} are connected; it waits for more", file=sys.stderr)
    if participants is not None:
        if session.embedded is not None:
            session.embedded.wait_ready(session.client)
        meta = _meta(session, keys)
        kinds = [k for k in meta.get("devices", "").split(",") if k]
        connected = sum(len(liveness.alive(session.client, kind)) for kind in kinds)
        if connected < participants:
            print(f"graph {meta['name']!r}: {connected} worker(s) connected, fewer than participants="
                  f"{participants}; it runs on those, and on any that connect later", file=sys.stderr)
    if timeout is not None:
        track_progress(progress_bar=False, timeout=timeout)


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
    """Show a progress bar (ops run; for a graph with training loops, loop steps run, with their rate) until
    the graph is done. Raises `GraphFailedError` (op, error, worker,
    source line) if it failed, `TimeoutError` after `timeout` seconds. While work waits for a kind of worker
    that nobody runs, says so ("waiting for a GPU worker") instead of waiting silently."""
    from tqdm import tqdm
    session = _require()
    keys = session.keys()
    meta = _meta(session, keys)
    if meta["state"] == "activated":
        raise GraphStateError(f"graph {meta['name']!r} has not been started: call R.execute()")
    if int(meta["n_ops"]) == 0:  # constant folding computed everything at activate: no bar to show
        if progress_bar:
            print(f"graph {meta['name']!r}: computed entirely by R.activate() (constant folding); nothing ran "
                  "on workers", file=sys.stderr)
        return
    try:
        if session.embedded is not None:
            session.embedded.wait_ready(session.client)
        _track_through_outages(session, keys, meta, progress_bar, timeout, tqdm)
    except KeyboardInterrupt:
        # A plain KeyboardInterrupt (`except KeyboardInterrupt` still works, and uncaught it exits as Ctrl-C
        # does: Python only does that for the exact class), marked so that uncaught it prints one line
        # instead of a traceback from inside the Redis client.
        interrupted = KeyboardInterrupt(_interrupted_text(session, keys))
        interrupted.brief = True
        print_interrupts_briefly()
        raise interrupted from None


def print_interrupts_briefly():
    """Make an uncaught KeyboardInterrupt marked `brief` print only its message; everything else goes to the
    sys.excepthook that was there. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, "brief_interrupts", False):
        return

    def hook(kind, value, traceback):
        if isinstance(value, KeyboardInterrupt) and getattr(value, "brief", False):
            print(value, file=sys.stderr)
        else:
            previous(kind, value, traceback)

    hook.brief_interrupts = True
    sys.excepthook = hook


def _interrupted_text(session, keys):
    """One line for a Ctrl-C in track_progress: what was interrupted, what happens to the graph, how to
    resume."""
    try:
        meta = store_graphs.read_state(session.client, keys)
        where = f"{meta['name']!r} ({meta['ops_done']} of {meta['n_ops']} ops run)"
    except (redis.RedisError, KeyError):  # the interrupt may have broken the connection: say less
        where = keys.graph_id
    if session.embedded is not None:
        fate = "it stops with this process, since the embedded default's server and workers do; run the script " \
               "again to start over"
    else:
        fate = (f"it keeps running on the workers of {redact(session.url)}; R.initialize(token={session.token!r}, "
                f"redis_url=...) then R.track_progress() or R.fetch_persisting_op(name) resumes")
    return f"interrupted R.track_progress() of graph {where}: {fate}"


def _track_through_outages(session, keys, meta, progress_bar, timeout, tqdm):
    """`_track`, again after a lost connection (a server restart: the graph is in Redis), with backoff and one
    line when the server is lost and when it answers again. A refused login (a revoked user) ends it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    outage = Outage(lambda text: print(f"graph {meta['name']!r}: {text}", file=sys.stderr))
    while True:
        try:
            if outage.since is not None:
                session.client.ping()
                outage.ok()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            return _track(session, keys, meta, progress_bar, left, tqdm)
        except redis.AuthenticationError:
            raise ConnectionFailed(f"Redis at {redact(session.url)} refused this session's credentials (the "
                                   "user was revoked?)") from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"graph {meta['name']!r} is not done after {timeout} s: Redis at "
                                   f"{redact(session.url)} is unreachable ({exc})") from None
            time.sleep(outage.lost(exc))


def _track(session, keys, meta, progress_bar, timeout, tqdm):
    deadline = None if timeout is None else time.monotonic() + timeout
    last_event, warned, next_check = "0-0", set(), 0.0
    n_steps = int(meta.get("n_steps") or 0)
    # initial=: work done before the bar appeared is not counted in its rate (it would read millions of ops/s).
    with tqdm(total=n_steps or int(meta["n_ops"]),
              initial=store_graphs.steps_done(session.client, keys) if n_steps else int(meta["ops_done"]),
              unit="step" if n_steps else "op", desc=meta["name"],
              disable=not progress_bar, file=sys.stderr) as bar:
        while True:
            meta = _meta(session, keys)
            bar.update((store_graphs.steps_done(session.client, keys) if n_steps else int(meta["ops_done"]))
                       - bar.n)
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
                if meta.get("approach") == "federated":
                    providers = federated.waiting(session.client, keys, meta)
                    if providers and providers not in warned:
                        warned.add(providers)
                        print(f"graph {meta['name']!r}: {providers}", file=sys.stderr)
                    bar.set_postfix_str(providers)
            if deadline is not None and now >= deadline:
                missing = _missing_workers(session, meta)
                why = "; " + ", ".join(f"no {'GPU' if k == 'cuda' else 'CPU'} worker is running" for k in missing) \
                    if missing else ""
                if meta.get("approach") == "federated":
                    why += "; " + (federated.waiting(session.client, keys, meta) or "providers are joining")
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
    pipe.hget(FederatedKeys(keys).stats, op_name)
    node_id, bundle, statistic = pipe.execute()
    if statistic is not None:
        return _fetch_statistic(session, keys, op_name, statistic.decode(), wait, deadline)
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
        with progress.busy(f"fetching {name!r}"):
            data, meta = pipe.execute()
            meta = store_graphs.decode_state(meta)
            # Constants (and values folded into constants) are in Redis from R.activate() on, others only once
            # computed: nothing is returned before the graph starts, so the answer does not depend on folding.
            started = meta.get("state") != "activated"
            tensor = None if data is None or not started else stored.decode(session.client, key, data)
        if tensor is not None:
            return tensor
        if meta.get("state") == "done":
            raise GraphStateError(f"graph {meta['name']!r} is done but {name!r} is not in Redis")
        if not wait and not started:
            raise NotComputedError(f"{name!r} is not computed yet: graph {meta['name']!r} is activated but not "
                                   "started; call R.execute(), then R.track_progress() or "
                                   "fetch_persisting_op(name, wait=True)")
        _not_ready(session, keys, name, meta, wait, deadline)


def _fetch_statistic(session, keys, name, statistic, wait, deadline):
    """A federated statistic, {column: float}, merged from the providers' partials once all are in."""
    while True:
        pipe = session.client.pipeline(transaction=False)
        pipe.hgetall(FederatedKeys(keys).partials)
        pipe.hmget(keys.meta, store_graphs.STATE_FIELDS)
        pipe.hget(keys.meta, "rules")
        partials, meta, rules = pipe.execute()
        meta = store_graphs.decode_state(meta)
        if meta.get("state") == "done":
            return federated.release(name, statistic, rules, partials)
        _not_ready(session, keys, name, meta, wait, deadline)


def _not_ready(session, keys, name, meta, wait, deadline):
    """Raise why `name` cannot be fetched yet, or (wait=True) pause before looking again."""
    if not meta:
        raise GraphStateError(f"graph {keys.graph_id} is no longer in Redis (flushed?)")
    if meta["state"] == "failed":
        raise _failed(meta)
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
