"""`ravop`: see and steer a cluster from a shell.

    ravop status [--json]                 workers (device, state, what they run, memory, heartbeat) and graphs
    ravop graphs [--json]                 the token's graphs with progress, ETA and age
    ravop fetch GRAPH NAME -o FILE        a persisted tensor to .npy or .pt, a saved model to .pt (TorchScript)
    ravop cancel GRAPH                    end a graph, cancelled: no further subgraph of it starts
    ravop stop GRAPH [--reason TEXT]      end its training loops at their next epoch boundary, keeping what
                                          they trained: what follows them runs, the graph ends done
    ravop logs GRAPH [--json]             its failures: op, source line, worker, error
    ravop dashboard [--port N]            the web dashboard (read-only unless --admin-token is given)
    ravop admin token|worker create NAME  a Redis user for a requester or a worker on a shared server;
                                          prints its connection URL as the last line
    ravop admin token|worker revoke NAME  delete it (its connections are closed at once)
    ravop admin token|worker list         the users of that kind
    ravop admin token set NAME --max-memory SIZE --max-workers N --max-worker-seconds S --weight W
                                          a token's quotas and share (also flags of `token create`)

GRAPH is a graph id or name. The server is --redis URL, else $RAVOP_REDIS_URL, else the newest embedded session
of this user still running (R.initialize() with no URL); the token is --token, else $RAVOP_TOKEN, else that
session's token, else the user named in the URL (a `ravop admin token` user), else "local".
"""
import argparse
import importlib
import json
import os
import sys
import time
import warnings
from pathlib import Path

from ..core.errors import ConnectionFailed, RavopError
from ..local import last_session
from ..store import connect, repair, token_namespace
from ..store.connect import redact, url_user
from ..store.failure_lines import one_line
from ..store.lookup import find_graph
from . import admin, status

EXIT_USAGE, EXIT_ERROR = 2, 1


def _parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--redis", help="Redis URL (default: $RAVOP_REDIS_URL, else the last embedded session)")
    common.add_argument("--token", help="requester token (default: $RAVOP_TOKEN, else the embedded session's)")
    common.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser = argparse.ArgumentParser(prog="ravop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("status", parents=[common], help="workers and graphs")
    commands.add_parser("graphs", parents=[common], help="the token's graphs")
    fetch = commands.add_parser("fetch", parents=[common], help="save a persisted value to a file")
    fetch.add_argument("graph", metavar="GRAPH")
    fetch.add_argument("name", metavar="NAME", help="the persist name (op.persist_op(NAME) or save_model(NAME))")
    fetch.add_argument("-o", "--output", required=True, type=Path, help="FILE.npy or FILE.pt")
    cancel = commands.add_parser("cancel", parents=[common], help="cancel a graph")
    cancel.add_argument("graph", metavar="GRAPH")
    stop = commands.add_parser("stop", parents=[common], help="stop a graph's training at the next epoch boundary")
    stop.add_argument("graph", metavar="GRAPH")
    stop.add_argument("--reason", default="asked to stop", help="what the graph's record says")
    logs = commands.add_parser("logs", parents=[common], help="a graph's failures")
    logs.add_argument("graph", metavar="GRAPH")
    dashboard = commands.add_parser("dashboard", parents=[common], help="serve the web dashboard")
    dashboard.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    dashboard.add_argument("--port", type=int, default=8265, help="port (default: 8265; 0 picks a free one)")
    dashboard.add_argument("--admin-token", default=os.environ.get("RAVOP_DASHBOARD_ADMIN_TOKEN"),
                           help="allow cancelling graphs to whoever sends this token "
                                "(default: $RAVOP_DASHBOARD_ADMIN_TOKEN; none: read-only)")
    manage = commands.add_parser("admin", help="Redis users of requesters and workers (needs the admin URL)")
    kinds = manage.add_subparsers(dest="kind", required=True, metavar="token|worker")
    for kind in admin.KINDS:
        names = ("create", "revoke", "list", "set") if kind == "token" else ("create", "revoke", "list")
        actions = kinds.add_parser(kind, help=f"{kind} users").add_subparsers(dest="action", required=True,
                                                                               metavar="|".join(names))
        for action in names:
            sub = actions.add_parser(action, parents=[common])
            if action != "list":
                sub.add_argument("name", metavar="NAME")
            if kind == "token" and action in ("create", "set"):
                _quota_flags(sub)
    return parser


def _size(text: str) -> int:
    """Bytes from "268435456", "256MiB", "256M", "1GiB", "512KiB"."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    value = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = units.get(value[-1:], 1)
    try:
        number = float(value[:-1] if scale != 1 else value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or with KiB, MiB, GiB)") from None
    return int(number * scale)


def _quota_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-memory", type=_size, metavar="SIZE",
                        help="bytes the token's keys may hold in the store (256MiB, 1GiB, ...)")
    parser.add_argument("--max-workers", type=int, metavar="N", help="subgraphs of the token run at once")
    parser.add_argument("--max-worker-seconds", type=float, metavar="S",
                        help="worker time the token may use in all; a graph past it stops at a step boundary")
    parser.add_argument("--weight", type=float, metavar="W",
                        help="the token's share of the workers relative to other tokens' (default 1)")


def _quota_args(args: argparse.Namespace) -> dict:
    return {field: getattr(args, field, None) for field in ("max_memory", "max_workers", "max_worker_seconds",
                                                             "weight")}


def _target(args):
    """(url, token, where the URL came from) from the flags, the environment or the newest running embedded
    session."""
    url, token = args.redis or os.environ.get("RAVOP_REDIS_URL"), args.token or os.environ.get("RAVOP_TOKEN")
    source = "--redis" if args.redis else "$RAVOP_REDIS_URL"
    if not url:
        last = last_session.recall()
        if last is None:
            raise RavopError("no server given: pass --redis URL or set RAVOP_REDIS_URL (no running embedded "
                             "session of this user was found either)")
        url, token = last["url"], token or last["token"]
        source = f"the embedded session of process {last['pid']}, started " + \
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.get("started", 0)))
    return url, token_namespace(token or url_user(url) or "local"), source


# ------------------------------------------------------------------------------------------------ output

def _ago(seconds):
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"


def _mib(n):
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def _table(headers, rows):
    if not rows:
        return "  (none)"
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells + [list(headers)]) for i in range(len(headers))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join("  " + line.rstrip() for line in lines)


def _graph_rows(graphs):
    return [(g["id"], g["name"], g["state"] + (" (stopped early)" if g.get("stopped") else ""),
             f"{g['progress']:.1f}%", _ago(g["eta"]) if g["eta"] is not None else "-", _ago(g["age"])) for g in graphs]


_GRAPH_HEADERS = ("id", "name", "state", "progress", "eta", "age")


def _status_text(report, url):
    workers = report["workers"]
    return "\n".join([
        f"server {redact(url)}, token {report['token']!r}", "", f"workers ({len(workers)})",
        _table(("name", "user", "device", "state", "running", "threads", "numerics class", "memory (rss / limit)",
                "heartbeat"), [
            (w["name"], w.get("principal", "?"), w.get("device", "?"), w.get("state", "?"),
             f"{w['graph']} subgraph {w['subgraph']}" if w.get("graph") else "-", w.get("threads", "?"),
             w.get("numerics", "?"),
             f"{_mib(w.get('rss'))} / {_mib(w.get('memory_limit'))}", _ago(w["last_heartbeat_age"]) + " ago")
            for w in workers]),
        "", f"graphs ({len(report['graphs'])})", _table(_GRAPH_HEADERS, _graph_rows(report["graphs"])),
        *_replicas_text(report.get("replicas", [])), *_trust_text(report.get("trust", [])),
        *_shares_text(report.get("shares", []))])


def _replicas_text(rows: list) -> list:
    """Who runs each replica of the running fits and what it has contributed (ravop.store.contributions)."""
    if not rows:
        return []
    return ["", "replicas of running fits (workers over time)", _table(
        ("graph", "strategy", "replica", "workers", "steps", "samples", "rounds without it"),
        [(r["graph"], r["strategy"].split("(")[0], r["replica"].split()[-1], " -> ".join(r["workers"]) or "-",
          r["steps_done"], r["samples_done"], f"{len(r['rounds_without'])} of {r['rounds']}") for r in rows])]


def _shares_text(rows: list) -> list:
    """The tokens' shares of the workers and their quotas (ravop.store.quotas), if any token is an admin's."""
    if not rows:
        return []
    limit = lambda value, show: "-" if value is None else show(value)   # noqa: E731
    return ["", "tokens (fair share: worker time used, per weight)", _table(
        ("token", "weight", "worker time", "share", "running", "held back", "max memory", "max workers",
         "max worker time"),
        [(r["token"], f"{r['weight']:g}", f"{r['worker_seconds']:.1f} s",
          "-" if r["share"] is None else f"{100 * r['share']:.0f}%", r["running"], r["held"],
          limit(r["max_memory"], _mib),
          limit(r["max_workers"], str), limit(r["max_worker_seconds"], lambda v: f"{v:g} s")) for r in rows])]


def _trust_text(rows):
    """The workers' trust with this token (verify='spot'), if any has a record."""
    if not rows:
        return []
    return ["", "trust (verify='spot')", _table(
        ("user", "numerics class", "confirmed", "in a row", "unchecked", "mismatches", "banned"),
        [(r["worker"], r["kind"] or "-", r["confirmed"], r["streak"], r["unchecked"], r["mismatches"],
          "yes" if r["banned"] else "no") for r in rows])]


def _failures_text(graph_id, failures):
    lines = []
    for f in failures:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f["time"])) if f["time"] else "-"
        what = f"op {f['op']!r}" if f["op"] else f"by {f['by']}" if f.get("by") else f"subgraph {f['subgraph'] or '?'}"
        where = f" at {f['source']}" if f["source"] else ""
        worker = f" on worker {f['worker']}" if f["worker"] else ""
        lines.append(f"{when}  {f['reason']}: {what}{where}{worker}: {f['error']}")
    return "\n".join(lines) or f"graph {graph_id}: no failures"


# ------------------------------------------------------------------------------------------------ commands

def _fetch(url, token, keys, name, output):
    """Save the value persisted as `name` in the graph at `keys`; returns what was written."""
    # The one command that handles tensors imports torch here: the others only read Redis and start in a fraction
    # of a second without it (tests/tools/test_cli_no_torch.py).
    import numpy as np
    import torch

    import ravop as R
    # Saved models are rebuilt by the loader of the package that saved them; ravdl registers its kinds.
    importlib.import_module("ravdl.v2")
    session = R.initialize(token=token, redis_url=url)
    session.graph_id = keys.graph_id  # fetch from this graph, not the token's current one
    value = R.fetch_persisting_op(name)
    suffix = output.suffix.lower()
    if isinstance(value, torch.Tensor):
        if suffix == ".npy":
            np.save(output, value.numpy())
        elif suffix == ".pt":
            torch.save(value.as_subclass(torch.Tensor), output)  # a plain tensor: loads with weights_only
        else:
            raise RavopError(f"{name!r} is a tensor: write it to a .npy or .pt file, not {output.name!r}")
        return {"kind": "tensor", "shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
    if isinstance(value, torch.nn.Module):
        if suffix != ".pt":
            raise RavopError(f"{name!r} is a saved model: write it to a .pt file, not {output.name!r}")
        with warnings.catch_warnings():
            # torch's own fx.GraphModule annotates an empty attribute in __init__, which TorchScript warns
            # about on every script() of one: noise about torch's code, not the user's model.
            warnings.filterwarnings("ignore", "The TorchScript type system doesn't support instance-level",
                                    UserWarning)
            module = value if isinstance(value, torch.jit.ScriptModule) else torch.jit.script(value)
        torch.jit.save(module, str(output))
        return {"kind": "module", "type": type(value).__name__}
    raise RavopError(f"{name!r} holds a {type(value).__name__}, which cannot be written to a file")


def _command(args, client, url, token):
    """(JSON object, text) that the command prints."""
    if args.command == "status":
        report = status.cluster(client, token)
        return report, _status_text(report, url)
    if args.command == "graphs":
        graphs = status.graphs(client, token)
        return {"token": token, "graphs": graphs}, _table(_GRAPH_HEADERS, _graph_rows(graphs))
    keys = find_graph(client, token, args.graph)
    if args.command == "fetch":
        written = {"graph": keys.graph_id, "name": args.name, "file": str(args.output),
                   **_fetch(url, token, keys, args.name, args.output)}
        return written, f"wrote {written['kind']} {args.name!r} of graph {keys.graph_id} to {args.output}"
    if args.command == "stop":
        asked = status.request_stop(client, keys, args.reason, "ravop stop")
        return ({"graph": keys.graph_id, "stop_requested": asked},
                f"graph {keys.graph_id}: " + ("its loops stop at their next epoch boundary" if asked else
                                              "already ended, nothing to stop"))
    if args.command == "cancel":
        cancelled = status.cancel(client, keys)
        return ({"graph": keys.graph_id, "cancelled": cancelled},
                f"graph {keys.graph_id}: " + ("cancelled" if cancelled else "already ended, nothing to cancel"))
    failures = status.failures(client, keys)  # logs
    return {"graph": keys.graph_id, "failures": failures}, _failures_text(keys.graph_id, failures)


def _admin(args, client, url):
    """(JSON object, text) of `ravop admin KIND ACTION`; a new user's URL is the text's last line."""
    saved_note = ("; not saved: the server has no ACL or config file, so it forgets users when it restarts "
                  "(start it with --aclfile PATH)")
    if args.action == "list":
        found = admin.users(client, args.kind)
        return {"kind": args.kind, "users": found}, _table(("name", "enabled"), [(u["name"], u["enabled"])
                                                                              for u in found])
    if args.action == "revoke":
        saved, cancelled = admin.revoke(client, args.kind, args.name)
        return ({"kind": args.kind, "revoked": args.name, "saved": saved, "cancelled": cancelled},
                f"revoked {args.kind} user {args.name!r}" + (f" (saved to {saved})" if saved else saved_note)
                + (f"; cancelled its running graphs {', '.join(cancelled)}" if cancelled else ""))
    if args.action == "set":
        quota = admin.set_quota(client, args.name, _quota_args(args))
        return ({"token": args.name, **quota._asdict()},
                f"token {args.name!r}: " + ", ".join(f"{k}={v}" for k, v in quota._asdict().items()))
    user_url, saved = admin.create(client, url, args.kind, args.name,
                                   _quota_args(args) if args.kind == "token" else None)
    note = f"created {args.kind} user {args.name!r}" + (f" (saved to {saved})" if saved else saved_note)
    return {"kind": args.kind, "name": args.name, "url": user_url, "saved": saved}, f"{note}\n{user_url}"


def _serve_dashboard(args, client, token):
    from .dashboard import Dashboard
    dashboard = Dashboard(client, token, args.host, args.port, args.admin_token)
    access = "admin token required to cancel" if args.admin_token else "read-only"
    print(f"ravop dashboard on {dashboard.url} (token {token!r}, {access}; Prometheus metrics at "
          f"{dashboard.url}metrics); Ctrl-C stops it", flush=True)
    try:
        dashboard.serve_forever()
    except KeyboardInterrupt:
        pass


def run(args):
    url, token, source = _target(args)
    try:
        client = connect(url)
    except ConnectionFailed as exc:
        raise ConnectionFailed(f"{exc} (the URL is from {source})") from None
    try:
        if args.command == "dashboard":
            _serve_dashboard(args, client, token)
        else:
            report, text = (_admin(args, client, url) if args.command == "admin"
                            else _command(args, client, url, token))
            if args.command == "admin":   # the admin's rights also mend damaged shared streams
                for line in repair.work_streams(client):
                    print(f"ravop admin: repaired {line}", file=sys.stderr)
            print(json.dumps(report) if args.json else text)
    finally:
        client.close()
    return 0


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure is one line (ravop.store.failure_lines)
        print(f"ravop {args.command}: {one_line(exc, args.redis or os.environ.get('RAVOP_REDIS_URL'))}",
              file=sys.stderr)
        return EXIT_ERROR
