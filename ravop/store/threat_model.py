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


# The key classes' names, as the tables say them.
TENSORS = "A's graph: persisted results and other tensors"
SAME_HOST = "A's graph: same-host references of big constants (ravop.store.same_host)"
MARKERS = "A's graph: upload markers of big constants (ravop.store.background_upload)"
META, DONE = "A's graph: meta", "A's graph: finished set"
PROGRESS = "A's graph: progress (taken, ran, held, outbox, steps, attempts, deps, refs)"
CHECKPOINTS, EXCHANGES = "A's graph: checkpoints", "A's graph: values resident replicas exchange"
VOTERS, OWN_VOTE = "A's graph: the voters of a check (ravop.store.votes)", \
    "A's graph: a vote and part of a check by this worker's user (ravop.store.votes)"
SEGMENTS, TRACES = "A's graph: a spot-checked loop's segments", "A's graph: a disputed segment's traces"
SEALERS, OWN_SEAL = "A's graph: who sealed a result (ravop.store.seals)", \
    "A's graph: a result's seal by this worker's user"
DISPUTES, EVENTS = "A's graph: settled disputes", "A's graph: end events"
FEDERATED = "A's graph: federated providers' records (clients, partials; a secure graph's keys, shares and reveals)"
INBOX, TRUST, USAGE = "A's inbox", "A's spot-check trust records", "A's usage: worker time, subgraphs running"
STREAMS, DEAD, STARTING_MARKS, OPEN = "work streams", "dead letters", "starting marks", "federated open set"
REGISTRY, SETS, ADVERTS = "worker registry", "worker sets", "worker advertisements"


def key_classes(a: str = TOKEN_A, graph: str = "g1") -> List[Tuple[str, Optional[str]]]:
    """(class, a key of it) for every class of keys of the schema (ravop.store.keys), None for the server's
    own state (settings, users, scripts, the whole keyspace): what keyless commands reach."""
    ga = GraphKeys(a, graph)
    return [
        ("A's token keys (graph list, current graph)", TokenKeys(a).current),
        (INBOX, TokenKeys(a).inbox),
        ("A's banned workers", TokenKeys(a).banned),
        (TRUST, TokenKeys(a).trust),
        (META, ga.meta),
        ("A's graph: plan", ga.subgraphs),
        (PROGRESS, ga.taken),
        ("A's graph: spot-check policy, as its requester set it (ravop.store.votes)", ga.policy),
        ("A's graph: constants' digests at upload (ravop.store.seals)", ga.constants),
        (TENSORS, ga.tensor(5)),
        (SAME_HOST, ga.tensor(5) + ":f"),
        (MARKERS, ga.tensor(5) + ":u"),
        (DONE, ga.done),
        (CHECKPOINTS, ga.checkpoint(1)),
        (EXCHANGES, ga.exchange("r0", 1)),
        (VOTERS, ga.votes(1)),
        (OWN_VOTE, ga.vote(1, None, WORKER_USER)),
        ("A's graph: a vote and part of a check by another worker user", ga.vote(1, None, "other")),
        (SEGMENTS, ga.segments(1)),
        (TRACES, ga.traces(1, "0-5:other")),
        (SEALERS, ga.sealers(5)),
        (OWN_SEAL, ga.seal(5, WORKER_USER)),
        ("A's graph: a result's seal by another worker user", ga.seal(5, "other")),
        (DISPUTES, ga.disputes),
        (EVENTS, ga.events),
        (FEDERATED, ga.prefix + "shares"),
        (STREAMS, queue("cpu")),
        (DEAD, DEAD_LETTER),
        (STARTING_MARKS, STARTING),
        (OPEN, FEDERATED_OPEN),
        (REGISTRY, worker_key("w1")),
        (SETS, workers_set("cpu")),
        (ADVERTS, info_key("w1")),
        ("token registry", TOKENS),
        ("A's quotas and weight (ravop.store.quotas)", quota_key(a)),
        (USAGE, usage_key(a)),
        ("server (config, users, scripts, keyspace)", None),
    ]


# What a worker user can still do with its writes, on which key classes, and what answers it: every class a worker
# may write is in some row (tests/security/test_acl.py), and docs/operators/security.md shows this table.
WORKER_POWERS: Tuple[Tuple[Tuple[str, ...], str, str], ...] = (
    ((TENSORS, SAME_HOST, MARKERS), "write wrong outputs before the vote; overwrite or delete a result or a constant "
     "after it", "verify=k / 'spot': outvoted (the graph fails or the result is recomputed), the loser banned by the "
     "requester; a result overwritten after the vote: `SealBroken` at fetch; a constant overwritten after upload: "
     "the subgraph reading it fails naming it (`ConstantChanged`), a fetch of it raises `SealBroken`; a deleted "
     "value: the reader fails on a missing input. Not sealed: a constant a loop streams row by row"),
    ((META, PROGRESS, DONE, EVENTS), "fail or stall a graph, forge its meta, progress and end (the completion script's "
     "writes)", "the graph fails or stalls, never silently wrong for sealed values; `ravop logs` shows who"),
    ((CHECKPOINTS, EXCHANGES), "write wrong checkpoints or exchanged values of a running loop",
     "verify='spot' re-runs a segment from the checkpoint it started at: a changed one disagrees (a dispute); "
     "without a vote, nothing"),
    ((VOTERS,), "add names to a check's voters, mark a dispute narrowed (HSETNX: new fields only)",
     "a check's state is derived from the voters' own keys: a name without one counts for nothing; a dispute "
     "marked narrowed loses its diagnosis in `ravop logs`"),
    ((OWN_VOTE,), "vote once, any digest, on any result; skip the SPOT script and claim in its own key an unchecked "
     "draw, or a deadline's verdict (unverified, split); compute the draws in advance (they are public)",
     "a strict majority of distinct users decides; when the graph ends its requester recomputes each draw: a "
     "claimed unchecked draw that asked for a check, or a check still open, raises `CheckSkipped` naming it and bans "
     "the claimant; results accepted unverified are listed; a split fails the graph"),
    ((SEGMENTS, TRACES), "forge or delete a spot-checked loop's segment entries; forge a disputed segment's traces",
     "segment states are derived from the voters' keys (the runner's wait, the rewind); a segment's check left open "
     "when the graph ends raises `CheckSkipped`; forged traces mis-name the op where a dispute parted (diagnostics)"),
    ((SEALERS, OWN_SEAL), "add its own seal to a value (one vote)",
     "a strict majority of distinct sealers decides; a tie fails the fetch, never returns its value"),
    ((DISPUTES, DEAD), "forge dispute records and dead letters", "diagnostics only: `ravop logs` may show false ones"),
    ((TRUST,), "raise its own trust streak (skip the warm-up of `trust_after` checks) or reset another user's",
     "its results are still drawn for checks at `rate`, and the requester verifies the draws; a reset costs checks, "
     "not correctness"),
    ((STREAMS,), "ack, delete or re-add messages of the work streams (XADD with MAXLEN)",
     "work is re-delivered by the takeover; a dropped re-run lets a check end unverified, which the requester lists"),
    ((STARTING_MARKS, OPEN, INBOX), "delay a graph's start: take a start out of an inbox, clear starting marks, "
     "close a federated graph to providers", "a dropped start is posted again by the requester, then raised"),
    ((REGISTRY, SETS, ADVERTS), "forge or erase liveness keys and advertisements",
     "status shows a worker that does not serve; work waits for a live one"),
    ((USAGE,), "overstate or understate a token's worker time and running subgraphs",
     "a token waits or gets past its quotas: quotas bind honest workers only"),
    ((FEDERATED,), "rewrite a secure federated graph's public keys",
     "pinned: the owner of the key refuses to share once it sees it rewritten, the survivors refuse to reveal any "
     "share, and the graph fails naming the provider whose key was rewritten (docs/users/federated.md); not signed, "
     "so the rewriter meanwhile reads the shares encrypted to the keys it forged: one of each other provider's two "
     "secrets per forged key, enough to unmask a provider's sums once it controls t of the n keys (its own slot "
     "included)"),
    ((FEDERATED,), "rewrite a secure graph's shares or reveals, or declare a provider dropped (HSET on `clients`)",
     "shares are encrypted and authenticated to their recipient (ChaCha20-Poly1305): a rewritten one fails the graph "
     "naming sender and recipient; a rebuilt seed or key is checked against the provider's commitment or published "
     "key before release. A provider declared dropped that was only slow keeps its self-mask: its late sums read as "
     "random; t > n/2 keeps t shares of both its secrets out of reach. The sum of fewer providers is released with a "
     "warning naming the dropped"),
    ((FEDERATED,), "rewrite a federated graph's partials or clients",
     "a secure aggregate is checked for consistency (count, sums within the range) before release; a plain one is "
     "not (the store is trusted with plain partials)"),
    (("server (config, users, scripts, keyspace)",), "run a long script (BUSY for everyone)",
     "others get BUSY and wait it out (busy-reply-threshold); `SCRIPT KILL` by the admin"),
)


def powers_table() -> str:
    """The markdown table of what a worker user can still do (docs/operators/security.md)."""
    rows = ["| power | keys | answer |", "|---|---|---|"]
    rows += [f"| {power} | {'; '.join(classes)} | {answer} |" for classes, power, answer in WORKER_POWERS]
    return "\n".join(rows) + "\n"


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

