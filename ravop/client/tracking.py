"""R.execute, R.track_progress and R.get_my_graphs: start the activated graph, follow it until it ends, and
list the token's graphs."""
import json
import sys
import time
from contextlib import nullcontext
from typing import Any, Callable, Dict, List, Optional

import redis
from redis.exceptions import RedisClusterException

from ..core import graph_states, progress
from ..core.errors import ConnectionFailed, GraphStateError
from ..core.spot_policy import Verify
from ..record.graph import current_graph
from ..store import GraphKeys, TokenKeys
from ..store import graphs as store_graphs
from ..store import workers as liveness
from ..store import cluster_health, server_replies
from ..store.connect import Outage, redact
from ..store.keys import usage_key
from ..store.quotas import HELD
from . import bans, watching
from .graph_kinds import kind_of
from .session import Session, require
from .stored_values import failure, read_meta

POLL_SECONDS = 0.2    # how often a tracker refreshes the progress bar
START_POLL_SECONDS = (0.002, 0.1)  # a token user looks whether a worker started its graph: first, longest pause
START_WAIT_SECONDS = 10.0  # how long R.execute() waits for that while workers are connected
# A start dropped from the inbox unstarted (a worker user may ZREM any inbox) is posted again this many times, then
# the requester is told who can do that
RESENDS = 3


def execute(timeout: Optional[float] = None, participants: Optional[int] = None) -> None:
    """Start the activated graph: enqueue its subgraphs that wait for nothing. Idempotent. With `timeout`,
    also wait until the graph is done, as `track_progress(progress_bar=False, timeout=timeout)` does:
    `GraphFailedError` if it failed, `TimeoutError` (naming a kind of worker nobody runs) after `timeout` s.

    `participants` is the original's number of providers to compute the graph: here the graph runs on the
    workers that are connected, as many as it has parallel work for; if fewer than `participants` are
    connected, execute() says so."""
    if participants is not None and (type(participants) is not int or participants < 1):
        raise ValueError(f"participants must be a positive int, not {participants!r}")
    session = require()
    graph = current_graph()
    if graph.nodes and not graph.activated:
        raise GraphStateError(f"graph {graph.name!r} is not activated: call R.activate() first")
    keys = session.keys()
    # set at upload; read before the start: after it, the workers taking up the graph compete for the server
    approach, copies, spot = session.client.hmget(keys.meta, "approach", "verify", "spot")
    try:
        session.handoff.start(keys)
    except redis.ResponseError as exc:
        if "NOGRAPH" in str(exc):
            raise GraphStateError(f"graph {keys.graph_id} is no longer in Redis (flushed?)") from None
        raise
    if not session.handoff.confined:  # else the worker that starts it opens it too (ravop.store.inbox)
        kind_of(approach).start(session.client, keys)
    elif any(liveness.alive(session.client, kind) for kind in ("cpu", "cuda")):
        try:
            _wait_for_start(session, keys, START_WAIT_SECONDS, until_held=True)
        except TimeoutError as exc:   # R.track_progress() waits on; say why now rather than hang here
            print(f"ravop: {exc}", file=sys.stderr)
    copies = int(copies or 1)
    if spot:   # a check needs `copies` distinct workers (a tie-break one more)
        copies = Verify.decode(spot).copies
    if copies > 1:
        if session.embedded is not None:
            session.embedded.wait_ready(session.client)
        meta = read_meta(session, keys)
        connected = sum(len(liveness.alive(session.client, k)) for k in meta.get("devices", "").split(",") if k)
        if connected < copies:
            waits = (f"a check waits for more for {Verify.decode(spot).settle_seconds:g} s, then ends unverified"
                     if spot else "it waits for more")
            needs = (f"verify='spot' checks results on workers of {copies} different users ({copies + 1} for a "
                     "disputed one)" if spot else
                     f"verify={copies} runs each subgraph on workers of {copies} different users")
            print(f"graph {meta['name']!r}: {needs}, but {connected} workers are connected; {waits}",
                  file=sys.stderr)
    if participants is not None:
        if session.embedded is not None:
            session.embedded.wait_ready(session.client)
        meta = read_meta(session, keys)
        kinds = [k for k in meta.get("devices", "").split(",") if k]
        connected = sum(len(liveness.alive(session.client, kind)) for kind in kinds)
        if connected < participants:
            print(f"graph {meta['name']!r}: {connected} worker(s) connected, fewer than participants="
                  f"{participants}; it runs on those, and on any that connect later", file=sys.stderr)
    if timeout is not None:
        track_progress(progress_bar=False, timeout=timeout)


def _missing_workers(session: Session, meta: Dict[str, str]) -> List[str]:
    """Device kinds this graph needs that no live worker serves."""
    kinds = [k for k in meta.get("devices", "").split(",") if k]
    return [kind for kind in kinds if not liveness.alive(session.client, kind)]


def _waiting_text(kinds: List[str]) -> str:
    return ", ".join(f"waiting for a {'GPU' if kind == 'cuda' else 'CPU'} worker" for kind in kinds)


def track_progress(progress_bar: bool = True, timeout: Optional[float] = None) -> None:
    """Show a progress bar (ops run; for a graph with training loops, loop steps run, with their rate) until
    the graph is done. Raises `GraphFailedError` (op, error, worker,
    source line) if it failed, `TimeoutError` after `timeout` seconds. While work waits for a kind of worker
    that nobody runs, says so ("waiting for a GPU worker") instead of waiting silently."""
    from tqdm.auto import tqdm   # a widget in Jupyter, text on a terminal
    session = require()
    keys = session.keys()
    meta = _first_meta(session, keys)
    if meta["state"] == graph_states.ACTIVATED and (keys.graph_id in session.handoff.posted or
                                                    session.client.zscore(TokenKeys(keys.token).inbox, keys.graph_id)):
        _wait_for_start(session, keys, timeout)
        meta = read_meta(session, keys)
    if meta["state"] == graph_states.ACTIVATED:
        raise GraphStateError(f"graph {meta['name']!r} has not been started: call R.execute()")
    if int(meta["n_ops"]) == 0:  # constant folding computed everything at activate: no bar to show
        if progress_bar:
            print(f"graph {meta['name']!r}: computed entirely by R.activate() (constant folding); nothing ran "
                  "on workers", file=sys.stderr)
        return
    try:
        if session.embedded is not None:
            # The first graph after R.initialize() waits for a local worker to import torch and register (the
            # others start after it, and join the graph when they have).
            with progress.busy(f"{meta['name']}: local workers starting") if progress_bar else nullcontext():
                session.embedded.wait_ready(session.client, first_only=True)
        _track_through_outages(session, keys, meta, progress_bar, timeout, tqdm)
    except KeyboardInterrupt:
        # A plain KeyboardInterrupt (`except KeyboardInterrupt` still works, and uncaught it exits as Ctrl-C
        # does: Python only does that for the exact class), marked so that uncaught it prints one line
        # instead of a traceback from inside the Redis client.
        interrupted = KeyboardInterrupt(_interrupted_text(session, keys))
        setattr(interrupted, "brief", True)
        print_interrupts_briefly()
        raise interrupted from None


def _wait_for_start(session: Session, keys: GraphKeys, timeout: Optional[float], until_held: bool = False) -> None:
    """A `ravop admin` token user's graph waits in its inbox until a worker starts it (ravop.store.inbox); with
    `until_held` (R.execute), or until the workers say they hold the token's graphs back for fair share (its own
    work waits to be run: R.execute() returns, R.track_progress() waits)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = START_POLL_SECONDS[0]
    resent = 0
    while True:
        while _in_inbox(session, keys) and not (until_held and _held_back(session, keys)):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"graph {keys.graph_id} was not started within {timeout} s: no worker took it "
                                   f"from token {keys.token!r}'s inbox (are workers connected?)")
            time.sleep(pause)
            pause = min(pause * 2, START_POLL_SECONDS[1])
        # a worker starts a graph before it takes it out of the inbox: out of it and not started is dropped
        if (keys.graph_id not in session.handoff.posted or _in_inbox(session, keys) or
                read_meta(session, keys)["state"] != graph_states.ACTIVATED):
            return
        if resent == RESENDS:
            raise GraphStateError(f"graph {keys.graph_id}'s start was removed from the inbox of token {keys.token!r} "
                                  f"{RESENDS + 1} times without being started: a worker user is dropping it (ZREM "
                                  "on inboxes is granted to workers; docs/operators/security.md)")
        resent += 1
        print(f"ravop: graph {keys.graph_id}'s start was removed from the inbox of token {keys.token!r} without being "
              "started; posted again", file=sys.stderr)
        session.handoff.start(keys)


def _held_back(session: Session, keys: GraphKeys) -> bool:
    return int(session.client.hget(usage_key(keys.token), HELD) or 0) > 0


def _in_inbox(session: Session, keys: GraphKeys) -> bool:
    try:
        return session.client.zscore(TokenKeys(keys.token).inbox, keys.graph_id) is not None
    except redis.AuthenticationError:
        raise _revoked(session) from None


def print_interrupts_briefly() -> None:
    """Make an uncaught KeyboardInterrupt marked `brief` print only its message; everything else goes to the
    sys.excepthook that was there. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, "brief_interrupts", False):
        return

    def hook(kind: Any, value: BaseException, traceback: Any) -> None:
        if isinstance(value, KeyboardInterrupt) and getattr(value, "brief", False):
            print(value, file=sys.stderr)
        else:
            previous(kind, value, traceback)

    setattr(hook, "brief_interrupts", True)
    sys.excepthook = hook


def _interrupted_text(session: Session, keys: GraphKeys) -> str:
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


def _track_through_outages(session: Session, keys: GraphKeys, meta: Dict[str, str], progress_bar: bool,
                           timeout: Optional[float], tqdm: Callable[..., Any]) -> None:
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
            raise _revoked(session) from None
        except redis.ResponseError as exc:   # BUSY, LOADING, a failover: as an outage; a damaged key: say so
            if server_replies.kind_of(exc) != "transient":
                raise GraphStateError(f"graph {meta['name']!r} ({keys.graph_id}) cannot be followed: the server "
                                      f"answered {server_replies.first_line(exc)!r} (its keys were damaged or "
                                      "deleted)") from None
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"graph {meta['name']!r} is not done after {timeout} s: Redis at "
                                   f"{redact(session.url)} answers {server_replies.first_line(exc)!r}") from None
            _fail_if_a_node_is_lost(session, meta, exc)
            time.sleep(outage.lost(exc))
        except (redis.ConnectionError, redis.TimeoutError, RedisClusterException) as exc:
            if session.embedded is not None:
                session.embedded.check()   # its server gone for good: say so now, not after a long backoff
            _fail_if_a_node_is_lost(session, meta, exc)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"graph {meta['name']!r} is not done after {timeout} s: Redis at "
                                   f"{redact(session.url)} is unreachable ({exc})") from None
            time.sleep(outage.lost(exc))


def _revoked(session: Session) -> ConnectionFailed:
    return ConnectionFailed(f"Redis at {redact(session.url)} refused this session's credentials (the user was "
                            "revoked?)")


def _first_meta(session: Session, keys: GraphKeys) -> Dict[str, str]:
    """The graph's state, read through an outage as `_track_through_outages` follows it."""
    outage = Outage(lambda text: print(f"graph {keys.graph_id}: {text}", file=sys.stderr))
    while True:
        try:
            meta = read_meta(session, keys)
            outage.ok()
            return meta
        except redis.AuthenticationError:
            raise _revoked(session) from None
        except (redis.ConnectionError, redis.TimeoutError, RedisClusterException) as exc:
            _fail_if_a_node_is_lost(session, {"name": keys.graph_id}, exc)
            time.sleep(outage.lost(exc))


def _fail_if_a_node_is_lost(session: Session, meta: Dict[str, str], exc: BaseException) -> None:
    """ConnectionFailed naming the nodes a Redis Cluster lost with no replica to replace them (a blip, or a
    primary a replica is taking over from, is waited out as an outage)."""
    lost = cluster_health.lost_primaries(session.client)
    if lost:
        raise ConnectionFailed(f"graph {meta['name']!r} cannot go on: the Redis Cluster of {redact(session.url)} "
                               f"lost {', '.join(lost)}, and no replica took its place ({server_replies.first_line(exc)}"
                               "); restart that node (its append-only file keeps the graphs) and call "
                               "R.track_progress() again") from None


def _track(session: Session, keys: GraphKeys, meta: Dict[str, str], progress_bar: bool, timeout: Optional[float],
           tqdm: Callable[..., Any]) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    last_event, warned, next_check = "0-0", set[str](), 0.0
    kind = kind_of(meta.get("approach"))
    n_steps = int(meta.get("n_steps") or 0)
    # initial=: work done before the bar appeared is not counted in its rate (it would read millions of ops/s).
    watchers = watching.of(keys.graph_id)   # fit callbacks (ravdl.v2.callbacks), fed at each refresh

    def done(meta: Dict[str, str]) -> int:   # what the bar counts (not read for no bar: a round trip each time)
        if not progress_bar:
            return 0
        return store_graphs.steps_done(session.client, keys) if n_steps else int(meta["ops_done"])

    with tqdm(total=n_steps or int(meta["n_ops"]), initial=done(meta), unit="step" if n_steps else "op",
              desc=meta["name"], disable=not progress_bar, file=sys.stderr) as bar:
        while True:
            meta = read_meta(session, keys)
            bar.update(done(meta) - bar.n)
            for watcher in watchers:
                watcher.poll(session.client, keys, meta["state"])
            if meta["state"] in graph_states.ENDED:
                for watcher in watchers:
                    watcher.ended(session.client, keys, meta["state"])
                watching.forget(keys.graph_id)
                verdicts = bans.review(session, keys, meta["state"] == graph_states.DONE)
                for banned, reason in ((verdicts.outvoted, bans.REASON), (verdicts.skippers, bans.SKIPPED)):
                    if banned:
                        print(f"graph {meta['name']!r}: {', '.join(banned)} banned from the work of token "
                              f"{keys.token!r} ({reason})", file=sys.stderr)
                if verdicts.unverified:
                    print(f"graph {meta['name']!r}: accepted unverified: {'; '.join(verdicts.unverified)}",
                          file=sys.stderr)
                if meta["state"] != graph_states.DONE:
                    raise failure(meta)
                if verdicts.skipped:
                    raise bans.CheckSkipped(f"graph {meta['name']!r} ended, but a worker user skipped its spot checks "
                                            f"(docs/operators/security.md): {'; '.join(verdicts.skipped)}")
                if meta.get("stopped"):   # a stop was asked for (EarlyStopping, `ravop stop`): not an error
                    print(f"graph {meta['name']!r}: {meta['stopped']}", file=sys.stderr)
                elif meta.get("stop"):
                    print(f"graph {meta['name']!r}: a stop was asked for ({meta['stop']}), but it ended first or its "
                          "loops cannot stop early (a parallel strategy's replicas): it trained to the end",
                          file=sys.stderr)
                return
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
                besides = kind.waiting(session.client, keys, meta) or bans.waiting(session, keys)
                if besides and besides not in warned:
                    warned.add(besides)
                    print(f"graph {meta['name']!r}: {besides}", file=sys.stderr)
                if besides:
                    bar.set_postfix_str(besides)
            if deadline is not None and now >= deadline:
                missing = _missing_workers(session, meta)
                why = "; " + ", ".join(f"no {'GPU' if k == 'cuda' else 'CPU'} worker is running" for k in missing) \
                    if missing else ""
                besides = kind.waiting(session.client, keys, meta) or bans.waiting(session, keys)
                if besides:
                    why += "; " + besides
                raise TimeoutError(f"graph {meta['name']!r} is not done after {timeout} s: {meta['ops_done']} of "
                                   f"{meta['n_ops']} ops run{why}")
            wait = POLL_SECONDS if deadline is None else max(0.001, min(POLL_SECONDS, deadline - now))
            # Blocks until the graph ends (its events stream gets an entry) or the next refresh is due.
            for _, entries in session.client.xread({keys.events: last_event}, block=int(wait * 1000)) or ():
                last_event = entries[-1][0]


def get_my_graphs(show: bool = True) -> List[Dict[str, Any]]:
    """This token's graphs, oldest first: dicts with id, name, algorithm, approach, rules, state, progress
    (percent of ops run), ops, subgraphs and created (Unix time). With `show`, also prints them as the
    original's table (Id, Name, Approach, Algorithm, Rules, Status)."""
    session = require()
    graphs = store_graphs.list_graphs(session.client, session.token)
    if show:
        print(graphs_table(graphs))
    return graphs


def graphs_table(graphs: List[Dict[str, Any]]) -> str:
    header = ("Id", "Name", "Approach", "Algorithm", "Rules", "Status")
    rows = [(g["id"], g["name"], g["approach"], g["algorithm"], "" if g["rules"] is None else json.dumps(g["rules"]),
             f"{g['state']} ({g['progress']:g}%)") for g in graphs]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    text = [line, "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |", line]
    text += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(text + ([line] if rows else []) + ([] if rows else ["(no graphs)"]))
