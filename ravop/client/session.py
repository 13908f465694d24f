"""The requester's session: R.initialize and R.flush, and the current session the other steps use
(`require`). Activating a graph is `ravop.client.activation`, starting and tracking it `ravop.client.tracking`, fetching
its values `ravop.client.fetching`.

A session is a Redis connection and a token. Everything about a graph lives in Redis under the token
(`ravop.store.keys`), so the requester may exit after R.execute(): another process that calls
R.initialize(same token, same URL) finds the token's current graph and can track and fetch it.
"""
import gc
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

import redis
import torch

from ..core import numerics_mode
from ..core.errors import ConnectionFailed, GraphStateError
from ..core.persist_rules import PersistedIds
from ..local import last_session
from ..record.graph import set_current, unactivated_graph
from ..store import GraphKeys, Scripts, TokenKeys, connect, ensure_queues, token_namespace
from ..store import background_upload
from ..store import worker_info
from ..store import seals
from ..store.client_types import Client
from ..store.connect import redact, url_user
from ..store.flush import delete_token
from ..store.handoff import Handoff
from .stored_values import LOADERS, DoneValues  # noqa: F401  (LOADERS: where ravdl and R.model register loaders)

if TYPE_CHECKING:
    from ..local.embedded import EmbeddedCluster
    from ..tools.dashboard import Dashboard

DEFAULT_TOKEN = "local"
DEFAULT_WORKERS = 2


class Session:
    def __init__(self, client: Client, url: str, token: str, embedded: "Optional[EmbeddedCluster]" = None) -> None:
        self.client, self.url, self.token, self.embedded = client, url, token, embedded
        self.handoff = Handoff(client, Scripts(client))
        current = client.get(TokenKeys(token).current)
        self.graph_id: Optional[str] = current.decode() if current else None
        self._keys: Optional[GraphKeys] = None   # of graph_id (`keys`)
        # persist name -> node id of the graph this session activated: fetching one of its values then
        # skips the name lookup in Redis (one round trip instead of two; fetching each batch loss of a
        # training run adds up). Saved objects (bundles) still go through Redis.
        self.activated_names = PersistedIds({}, [])   # loop steps' names by rule, not listed
        self.done_values: Optional[DoneValues] = None   # small values of the finished graph last fetched from
        self.verified: Dict[str, bool] = {}   # graph id -> whether its values are sealed (`sealed`)
        self.dashboard: "Optional[Dashboard]" = None  # a ravop.tools.dashboard.Dashboard serving it (dashboard=True)

    def keys(self) -> GraphKeys:
        """Keys of the current graph: the one this process activated last, or (a process that records nothing)
        the token's last activated one. A graph recorded here and not activated yet has no values or progress in
        the store: GraphStateError, rather than an answer for the token's previous graph."""
        recording = unactivated_graph()
        if recording is not None:
            earlier = f"; the token's last activated graph ({self.graph_id}) is another one" if self.graph_id else ""
            raise GraphStateError(
                f"graph {recording.name!r} (id {recording.id}) is not activated, so nothing of it is computed or "
                f"stored{earlier}: call R.activate() and R.execute() first (an earlier graph's value: "
                "R.fetch_persisting_op(name, graph=<its Graph, id or name>))")
        if self.graph_id is None:
            raise GraphStateError(f"no graph has been activated under token {self.token!r}: record ops, "
                                  "persist_op() the values to fetch, then R.activate()")
        keys = self._keys
        if keys is None or keys.graph_id != self.graph_id:   # made once per graph: a fetch per loss asks for them
            keys = self._keys = GraphKeys(self.token, self.graph_id)
        return keys

    def sealed(self, keys: GraphKeys) -> bool:
        """Whether the graph at `keys` runs under a vote, so that its values are sealed (ravop.store.seals); read
        once per graph: it never changes after R.activate()."""
        known = self.verified.get(keys.graph_id)
        if known is None:
            known = self.verified[keys.graph_id] = seals.verified(self.client, keys)
        return known

    def close(self) -> None:
        if self.dashboard is not None:
            self.dashboard.stop()
        background_upload.finish(self.token)   # its constants' chunks still going up use this connection
        self.client.close()
        if self.embedded is not None:
            self.embedded.stop()


_session: Optional[Session] = None


def initialize(token: Optional[str] = None, redis_url: Optional[str] = None, workers: Optional[int] = None,
               device: str = "cpu", timeout: float = 5.0, data: Union[None, str, Sequence[Any]] = None,
               dashboard: Union[bool, int] = False, ravenverse_token: Optional[str] = None,
               numerics: Optional[str] = None) -> Session:
    """Connect to Redis at `redis_url` (or $RAVOP_REDIS_URL); with neither, start the embedded default: a
    private server and `workers` local worker processes on `device` (default $RAVOP_WORKERS or 2).

    `data` (default $RAVOP_DATA, paths separated by os.pathsep) makes embedded workers data providers for
    federated graphs: one provider per entry, each a file path or a list of paths (CSV or Parquet).

    `token` (or the original's `ravenverse_token=`; default $RAVOP_TOKEN, else the user named in the URL (a
    `ravop admin token` user), else "local") names the requester and
    namespaces its graphs and results: a token that is not a short name is a secret of any length, and only
    a digest of it is used (`ravop.store.keys.token_namespace`). An unreachable URL raises `ConnectionFailed` within about `timeout` seconds. `dashboard=True` (or a port
    number) serves the read-only web dashboard of this session on 127.0.0.1 and prints its URL. `numerics`
    ("default" or "reproducible", default $RAVOP_NUMERICS) is the embedded workers' `ravop-worker --numerics`, and this
    process's too (its compiler folds constants with the same kernels); a cluster's workers choose their own."""
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
    if numerics is not None:
        if url:
            raise ValueError("numerics= chooses the embedded workers' kernels; on a cluster each worker chooses its "
                             "own (ravop-worker --numerics)")
        os.environ[numerics_mode.ENV] = numerics_mode.check(numerics)
    numerics = numerics_mode.current()
    token = token_namespace(token or ravenverse_token or os.environ.get("RAVOP_TOKEN") or (url and url_user(url))
                            or DEFAULT_TOKEN)
    data = _provider_data(data if data is not None else os.environ.get("RAVOP_DATA"))
    embedded = None
    if url:
        if data:
            raise ValueError("data= (or $RAVOP_DATA) gives the embedded workers data; on a cluster each provider "
                             "runs ravop-worker --data PATH")
        client = connect(url, timeout)
    elif _session is not None and _session.embedded is not None and _session.embedded.data == data \
            and _session.embedded.numerics == numerics and _session.embedded.running():
        embedded, url, client = _session.embedded, _session.url, _session.client  # keep the running one
    else:
        from ..local.embedded import EmbeddedCluster, default_data_dir
        count = workers if workers is not None else max(int(os.environ.get("RAVOP_WORKERS", DEFAULT_WORKERS)),
                                                        len(data))
        if count < len(data):
            raise ValueError(f"data= names {len(data)} providers but workers={count}: each provider is a worker")
        embedded = EmbeddedCluster(count, device, data=data, data_dir=default_data_dir(), numerics=numerics)
        if count and torch.get_num_threads() > embedded.threads:
            # This process would compete with its own workers for the cores; on as many threads as one of
            # them, the user's eager PyTorch here also sums in the workers' order and reproduces their numbers.
            torch.set_num_threads(embedded.threads)
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
    except redis.exceptions.NoPermissionError:
        pass  # a `ravop admin` token user: the streams are the workers' (made by them and by `ravop admin`)
    try:
        _session = Session(client, url, token, embedded)
    except redis.exceptions.NoPermissionError:
        client.close()
        _session = None
        raise ConnectionFailed(f"the Redis user of {redact(url)} may not use token {token!r}: a `ravop admin token` "
                               "user may use only its own token (leave token= out to use it)") from None
    if embedded is not None:
        last_session.remember(url, token)  # `ravop status` in another terminal finds it
    if dashboard is not False:
        from ..tools.dashboard import Dashboard  # the web server is loaded only when asked for
        _session.dashboard = Dashboard(client, token, port=0 if dashboard is True else dashboard).start()
        print(f"ravop dashboard: {_session.dashboard.url}")
    return _session


def _provider_data(data: Union[None, str, Sequence[Any]]) -> List[List[str]]:
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


def require() -> Session:
    """The current session; GraphStateError before R.initialize()."""
    if _session is None:
        raise GraphStateError("no session: call R.initialize() first (no arguments starts a local engine)")
    return _session


def _client() -> Client:
    return require().client


def live_workers() -> List[Dict[str, Any]]:
    """The live workers' advertisements on this session's server (`ravop.store.worker_info.read_all`)."""
    return worker_info.read_all(_client())


def _current_keys() -> GraphKeys:
    return require().keys()


def flush() -> None:
    """Delete this token's graphs, tensors and persisted values (idempotent; other tokens are untouched), and
    start recording a fresh graph."""
    session = require()
    delete_token(session.client, session.token)
    session.graph_id = None
    session.activated_names = PersistedIds({}, [])
    session.done_values = None
    set_current(None)
