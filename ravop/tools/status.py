"""What `ravop status`, `ravop graphs`, `ravop logs` and the dashboard show, as plain JSON-ready dicts read
from Redis: live workers, their trust with the token (verify='spot'), a token's graphs with progress and ETA,
one graph's subgraphs as a DAG coloured by state, its failures and disputes, what each replica of a running fit has
contributed and who ran it, and cancelling or stopping it.
Read-only except `cancel` and `request_stop`."""
import getpass
import os
import socket
import time

import redis

from ..core import graph_states
from ..core.spot_policy import TRUST_FIELDS, read_trust
from ..store import DEAD_LETTER, GraphKeys, Scripts, TokenKeys, access
from ..store.contributions import contributions
from ..store import graphs as store_graphs
from ..store import quotas
from ..store.keys import TOKENS
from ..store import worker_info
from ..store.connect import client_user
from ..store.unscripted import scripted_or_not

# How many dead-letter entries `failures` looks through (the stream is capped at about 10,000).
DEAD_LETTER_SCAN = 10_000


def graphs(client, token, now=None):
    """The token's graphs, oldest first (`ravop.store.graphs.list_graphs`), each with `age` (seconds since
    created), `elapsed` (seconds run so far, or in all) and `eta` (seconds left at the rate so far; None
    when unknown)."""
    now = time.time() if now is None else now
    listed = store_graphs.list_graphs(client, token)
    for graph in listed:
        graph["age"] = now - graph["created"]
        started, finished = graph["started"], graph["finished"]
        graph["elapsed"] = None if started is None else (finished or now) - started
        graph["eta"] = _eta(graph)
    return listed


def _eta(graph):
    if graph["state"] != graph_states.RUNNING or not graph["progress"] or graph["elapsed"] is None:
        return None
    return graph["elapsed"] * (100.0 - graph["progress"]) / graph["progress"]


def cluster(client, token):
    """{'time', 'token', 'workers': [...], 'graphs': [...]}: the object `ravop status --json` prints."""
    now = time.time()
    workers = worker_info.read_all(client)
    for worker in workers:
        worker["last_heartbeat_age"] = now - worker["heartbeat"]
    listed = graphs(client, token, now)
    return {"time": now, "token": token, "workers": workers, "graphs": listed,
            "replicas": replicas(client, token, listed), "trust": trust(client, token), "shares": shares(client, token)}


def replicas(client, token: str, listed: list) -> list:
    """Per replica of the running graphs' fits under a strategy: [{'graph', 'strategy', 'replica', 'workers' (over
    time: a takeover or a provider that joined names one more), 'steps_done', 'samples_done', 'rounds',
    'rounds_without'}] (ravop.store.contributions)."""
    rows = []
    for graph in listed:
        if graph["state"] == graph_states.RUNNING:
            found = contributions(client, GraphKeys(token, graph["id"]))
            rows += [{"graph": graph["id"], "strategy": strategy, "replica": role, **{k: seen[k] for k in (
                "workers", "steps_done", "samples_done", "rounds", "rounds_without")}}
                for strategy, roles in found.items() for role, seen in roles.items()]
    return rows


def shares(client, token: str) -> list:
    """Each `ravop admin` token's weight, quotas, worker time used and share of it, subgraphs running now
    (ravop.store.quotas.shares); a token user, who may read only its own, gets its own row (share None)."""
    if client_user(client) == token:
        rows = quotas.shares(client, [token])
        for row in rows:
            row["share"] = None
        return rows
    tokens = {t.decode() for t in client.smembers(TOKENS)}
    return quotas.shares(client, tokens | {token}) if tokens else []


def trust(client, token):
    """This token's record of each principal under verify='spot' (ravop.core.spot_policy), by principal (a
    worker's ACL user, or its name on an open server) and numerics class: [{'worker' (the principal), 'kind' (the
    class), 'streak', 'confirmed', 'mismatches', 'unchecked', 'banned'}], and principals banned without a record
    (verify=k)."""
    token_keys = TokenKeys(token)
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(token_keys.trust)
    pipe.smembers(token_keys.banned)
    raw, banned = pipe.execute()
    banned = {b.decode() for b in banned}
    rows = []
    for member, counts in sorted(read_trust(raw).items()):
        worker, _, kind = member.partition("@")   # a principal holds no '@' (spot_policy.principal_of)
        rows.append({"worker": worker, "kind": kind, **counts, "banned": worker in banned})
    known = {row["worker"] for row in rows}
    rows += [{"worker": w, "kind": "", **dict.fromkeys(TRUST_FIELDS, 0), "banned": True}
             for w in sorted(banned - known)]
    return rows


SUBGRAPH_STATES = ("waiting", "queued", "running", "done", "failed")


def subgraph_dag(client, keys):
    """The graph's subgraphs as a DAG: {'graph': meta fields, 'subgraphs': [{id, state, device, ops, level,
    worker}], 'edges': [[from, to], ...]}. `state` is one of SUBGRAPH_STATES; `level` is the longest path
    from a root (the column to draw it in)."""
    pipe = client.pipeline(transaction=False)
    pipe.hmget(keys.meta, store_graphs.STATE_FIELDS)
    pipe.hgetall(keys.info)
    pipe.smembers(keys.done)
    pipe.hgetall(keys.taken)
    pipe.hgetall(keys.deps)
    meta, info, done, taken, deps = pipe.execute()
    meta = store_graphs.decode_state(meta)
    if not meta:
        return None
    done = {int(s) for s in done}
    taken = {int(s): w.decode() for s, w in taken.items()}
    waiting_on = {int(s): int(n) for s, n in deps.items()}
    failed = int(meta["error_subgraph"]) if meta.get("error_subgraph", "").isdigit() else None
    import networkx as nx   # here, not at the top: a worker imports this module (metrics) and never draws DAGs
    dag = nx.DiGraph()
    for sid, routing in info.items():
        device, n_ops, successors, _ = routing.decode().split(";", 3)
        sid = int(sid)
        dag.add_node(sid, device=device, ops=int(n_ops))
        dag.add_edges_from((sid, int(s)) for s in successors.split(",") if s)
    level = {}
    for sid in nx.topological_sort(dag):
        level[sid] = max((level[p] + 1 for p in dag.predecessors(sid)), default=0)
    subgraphs = []
    for sid in sorted(dag.nodes):
        if sid in done:
            state = "done"
        elif sid == failed:
            state = "failed"
        elif sid in taken and meta["state"] == graph_states.RUNNING:
            state = "running"
        elif meta["state"] == graph_states.RUNNING and waiting_on.get(sid, 0) <= 0:
            state = "queued"
        else:
            state = "waiting"
        subgraphs.append({"id": sid, "state": state, "device": dag.nodes[sid]["device"],
                          "ops": dag.nodes[sid]["ops"], "level": level[sid], "worker": taken.get(sid)})
    return {"graph": {"id": keys.graph_id, **meta}, "subgraphs": subgraphs, "edges": [list(e) for e in dag.edges]}


def failures(client, keys):
    """What went wrong in a graph, newest first: its dead-letter entries (reason, op, source line, worker,
    error), its settled spot-check disputes (R.Graph(verify='spot')), and the failure recorded in its meta if no entry holds it any more."""
    found = []
    entries = []
    if _may_read_dead_letters(client, keys.token):
        try:
            entries = client.xrevrange(DEAD_LETTER, count=DEAD_LETTER_SCAN)
        except redis.exceptions.NoPermissionError:  # another user the server holds to less than the admin's rights
            pass
    for entry_id, fields in entries:
        fields = {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
        if fields.get("token") == keys.token and fields.get("graph") == keys.graph_id:
            seconds = int(entry_id.decode().split("-")[0]) / 1000
            found.append({"time": seconds, **{k: fields.get(k, "") for k in
                                              ("subgraph", "reason", "op", "source", "worker", "error")}})
    for entry_id, fields in client.xrevrange(keys.disputes, count=DEAD_LETTER_SCAN):   # verify='spot'
        fields = {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
        found.append({"time": int(entry_id.decode().split("-")[0]) / 1000,
                      **{k: fields.get(k, "") for k in ("subgraph", "reason", "op", "source", "worker", "error")}})
    found.sort(key=lambda f: f["time"], reverse=True)
    meta = store_graphs.read_state(client, keys)
    if meta.get("state") in graph_states.UNFINISHED and not any(f["error"] == meta.get("error") for f in found):
        finished = client.hget(keys.meta, "finished")
        found.append({"time": float(finished) if finished else None, "subgraph": meta.get("error_subgraph", ""),
                      "reason": "cancelled" if meta["state"] == graph_states.CANCELLED else "graph failed",
                      "op": meta.get("error_op", ""), "source": meta.get("error_source", ""),
                      "worker": meta.get("error_worker", ""), "error": meta.get("error", ""),
                      "by": meta.get("cancelled_by", "")})
    return found


def _may_read_dead_letters(client, token):
    """False for the token's own ACL user (`ravop admin token create`): its grants leave out the dead letters, the
    stream of every token's failures (ravop.store.access), and asking anyway would put a refusal in the server's
    ACL LOG. Its graph's failure is in the graph's meta, which `failures` reads."""
    return client_user(client) != token or access.allows(access.REQUESTER, "xrevrange", DEAD_LETTER, token)


CANCELLED = "cancelled by the user"


def requester(origin):
    """Who asks, for the graph's record: `origin` (what was used: 'ravop cancel', 'the dashboard', a fit
    callback), the OS user, the host and the process."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):   # no name for this uid (a container)
        user = f"uid {os.getuid()}"
    return f"{origin} ({user}@{socket.gethostname()}, pid {os.getpid()})"


def cancel(client, keys, reason=CANCELLED, origin="ravop cancel"):
    """Cancel a graph that is activated or running, so that no worker starts another of its subgraphs (a loop
    running stops within a second, worker/loops/graph_watch.py; other running ones finish and are dropped) and
    trackers raise `GraphCancelledError` naming who cancelled it (`origin`, see `requester`). True if it was
    cancelled, False if it had already ended."""
    if store_graphs.read_state(client, keys).get("state") not in graph_states.LIVE:
        return False  # done, failed or gone: nothing to stop, and nothing to log as cancelled
    by = requester(origin)
    return bool(scripted_or_not(client, lambda: Scripts(client).cancel(keys, reason, by=by),
                                lambda: store_graphs.cancel_watched(client, keys, reason, by)))


def request_stop(client, keys, reason, origin):
    """Ask a live graph's training loops to end at their next epoch boundary, as if recorded with fewer epochs:
    their outputs (the trained parameters, the optimizer state) are what they had then, what follows them runs,
    and the graph ends done, with `stopped` saying where each loop stopped (worker/loops/loop_subgraph.py). True if
    asked, False if the graph had already ended."""
    by = requester(origin)
    return bool(scripted_or_not(client, lambda: Scripts(client).stop(keys, reason, by),
                                lambda: store_graphs.stop_watched(client, keys, reason, by)))
