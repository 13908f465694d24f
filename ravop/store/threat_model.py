"""The threat model's table: what each role may write on each class of keys, derived from the grants of
ravop.store.access. The table in docs/operators/security.md is this one (tests/security/test_acl.py compares them), and
the same test checks on a real server that every write and administrative command of its COMMAND DOCS is
refused or allowed exactly as the table says, for token user A, token user B and a worker."""
from typing import Callable, List, Optional, Tuple

from .access import READS, REQUESTER, WORKER, allows, grants_of
from .keys import (DEAD_LETTER, FEDERATED_OPEN, STARTING, TOKENS, GraphKeys, TokenKeys, info_key, queue, quota_key,
                   usage_key, worker_key, workers_set)

TOKEN_A, TOKEN_B = "alice", "bob"  # the two token users of the table (any names give the same table)
WORKER_USER = "wk"   # the worker user of the table (its own seals and votes are its user's)
PRINCIPALS: Tuple[Tuple[str, str, str], ...] = (("token user A", REQUESTER, TOKEN_A),
                                                ("token user B", REQUESTER, TOKEN_B), ("a worker", WORKER, WORKER_USER))


def key_classes(a: str = TOKEN_A, graph: str = "g1") -> List[Tuple[str, Optional[str]]]:
    """(class, a key of it) for every class of keys of the schema (ravop.store.keys), None for the server's
    own state (settings, users, scripts, the whole keyspace): what keyless commands reach."""
    ga = GraphKeys(a, graph)
    return [
        ("A's token keys (graph list, current graph)", TokenKeys(a).current),
        ("A's inbox", TokenKeys(a).inbox),
        ("A's banned workers", TokenKeys(a).banned),
        ("A's spot-check trust records", TokenKeys(a).trust),
        ("A's graph: meta", ga.meta),
        ("A's graph: plan", ga.subgraphs),
        ("A's graph: persisted results and other tensors", ga.tensor(5)),
        ("A's graph: same-host references of big constants (ravop.store.same_host)", ga.tensor(5) + ":f"),
        ("A's graph: upload markers of big constants (ravop.store.background_upload)", ga.tensor(5) + ":u"),
        ("A's graph: finished set", ga.done),
        ("A's graph: checkpoints", ga.checkpoint(1)),
        ("A's graph: values resident replicas exchange", ga.exchange("r0", 1)),
        ("A's graph: voters and the state of a check (ravop.store.votes)", ga.votes(1)),
        ("A's graph: a vote by this worker's user (ravop.store.votes)", ga.vote(1, None, WORKER_USER)),
        ("A's graph: a vote by another worker user", ga.vote(1, None, "other")),
        ("A's graph: who sealed a result (ravop.store.seals)", ga.sealers(5)),
        ("A's graph: a result's seal by this worker's user", ga.seal(5, WORKER_USER)),
        ("A's graph: a result's seal by another worker user", ga.seal(5, "other")),
        ("A's graph: settled disputes", ga.disputes),
        ("A's graph: end events", ga.events),
        ("A's graph: federated hashes (providers, partials; a secure graph's keys, shares and reveals)",
         ga.prefix + "shares"),
        ("work streams", queue("cpu")),
        ("dead letters", DEAD_LETTER),
        ("starting marks", STARTING),
        ("federated open set", FEDERATED_OPEN),
        ("worker registry", worker_key("w1")),
        ("worker sets", workers_set("cpu")),
        ("worker advertisements", info_key("w1")),
        ("token registry", TOKENS),
        ("A's quotas and weight (ravop.store.quotas)", quota_key(a)),
        ("A's usage: worker time, subgraphs running", usage_key(a)),
        ("server (config, users, scripts, keyspace)", None),
    ]


def granted(role: str, namespace: str, key: Optional[str]) -> List[str]:
    """Every command of the grants that `role` may send naming `key` (keyless ones for None)."""
    keyless, grants = grants_of(role, namespace)
    if key is None:
        return sorted(keyless)
    return sorted({c for g in grants for c in g.commands if allows(role, c, key, namespace)})


def _cell(commands: List[str], keyless: bool) -> str:
    commands = [c.replace("|", " ") for c in commands]  # `xgroup create`: a "|" would split the table's cell
    if keyless:  # connection setup, transactions, INFO, and what is listed beyond those
        extra = [c for c in commands if c in ("scan", "publish", "subscribe", "script load", "script exists")]
        return "connection only" + (f"; {', '.join(extra)}" if extra else "")
    commands = [c for c in commands if c not in ("eval", "evalsha")]  # scripts: each command inside as listed
    writes = [c for c in commands if c.replace(" ", "|") not in READS]
    reads = len(writes) < len(commands)
    if not commands:
        return "none"
    return ("read" if reads else "") + ("; " if reads and writes else "") + ", ".join(writes) + \
        ("" if writes else " only")


def table(classes: Callable[[], List[Tuple[str, Optional[str]]]] = key_classes) -> str:
    """The markdown table of the threat model (docs/operators/security.md)."""
    rows = ["| keys | " + " | ".join(name for name, _, _ in PRINCIPALS) + " |",
            "|---" * (len(PRINCIPALS) + 1) + "|"]
    for what, key in classes():
        cells = [_cell(granted(role, ns, key), key is None) for _, role, ns in PRINCIPALS]
        rows.append(f"| {what} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"

