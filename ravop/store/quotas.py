"""Quotas and weights per token (`ravop admin token create/set --max-memory --max-workers --max-worker-seconds
--weight`), kept in `ravop:_:quota:{token}` where only the admin writes, and what each token used, in
`ravop:_:usage:{token}` (ravop.store.keys):

- max_memory: bytes the token's keys hold in the store (MEMORY USAGE of each, summed over a SCAN of its key space:
  what the server really holds, whoever wrote it). The requester checks it before an upload and a worker before
  it stores a subgraph's outputs; a refusal names the quota and the holder.
- max_workers: subgraphs of the token run at once; a worker that claims one more passes it on for later.
- max_worker_seconds: worker time the token used in all; a graph past it fails at its next step boundary.
- weight: the token's share of the workers relative to the others (default 1): a token's loop runs a time slice
  of `weight` slices before it yields to another token's waiting work (worker/loops/turns.py), and the inboxes
  start graphs in the order of worker time used per weight (ravop.store.inbox).

No module here imports torch: `ravop admin` and `ravop status` read and write these.
"""
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence

from ..core.errors import QuotaError
from .keys import token_pattern, quota_key, usage_key, worker_key

MIB = 2 ** 20
WORKER_SECONDS = "worker_seconds"
RUNNING = "run:"   # usage field prefix: run:{worker} -> "graph/subgraph"
HELD = "held"      # usage field: graphs of the token its inbox holds back for fair share at the last look


class Quota(NamedTuple):
    """A token's limits (None: unlimited) and weight."""
    max_memory: Optional[int] = None
    max_workers: Optional[int] = None
    max_worker_seconds: Optional[float] = None
    weight: float = 1.0


FIELDS = Quota._fields
_KINDS = {"max_memory": int, "max_workers": int, "max_worker_seconds": float, "weight": float}
# how each quota is named in a refusal: the flag that sets it
FLAG = {"max_memory": "--max-memory", "max_workers": "--max-workers", "max_worker_seconds": "--max-worker-seconds",
        "weight": "--weight"}


def checked(values: Dict[str, Any]) -> Dict[str, Any]:
    """`values` (field -> number, None to leave as it is) as stored; ValueError naming a bad one."""
    out = {}
    for field, value in values.items():
        if field not in _KINDS:
            raise ValueError(f"unknown quota {field!r}: one of {', '.join(FIELDS)}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or \
                (_KINDS[field] is int and value != int(value)):
            raise ValueError(f"{FLAG[field]} must be a positive {'whole ' if _KINDS[field] is int else ''}number, "
                             f"not {value!r}")
        out[field] = _KINDS[field](value)
    return out


def write(client: Any, token: str, values: Dict[str, Any]) -> Quota:
    """Set the quotas given (`checked`); returns the token's quota as it is now."""
    values = checked(values)
    if values:
        client.hset(quota_key(token), mapping={k: repr(v) for k, v in values.items()})
    return read(client, token)


def decode(raw: Dict[bytes, bytes]) -> Quota:
    """A Quota from the hash's fields (fields damaged or unknown are ignored: the default holds)."""
    values: Dict[str, Any] = {}
    for field, kind in _KINDS.items():
        value = raw.get(field.encode())
        if value is not None:
            try:
                values[field] = kind(float(value)) if kind is int else kind(value)
            except ValueError:
                continue
    return Quota(**values)


def read(client: Any, token: str) -> Quota:
    return decode(client.hgetall(quota_key(token)))


def held_bytes(client: Any, token: str) -> int:
    """Bytes the server holds for the token's keys (MEMORY USAGE, summed over a SCAN of its key space)."""
    total = 0
    batch: List[bytes] = []
    for key in client.scan_iter(match=token_pattern(token), count=1000):
        batch.append(key)
        if len(batch) >= 500:
            total += _usage(client, batch)
            batch = []
    return total + (_usage(client, batch) if batch else 0)


def _usage(client: Any, names: Sequence[bytes]) -> int:
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.memory_usage(name, samples=0)
    return sum(size or 0 for size in pipe.execute())


def mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB" if n < 10 * MIB else f"{n / MIB:.0f} MiB"


def check_memory(client: Any, token: str, adding: int, what: str, quota: Optional[Quota] = None) -> None:
    """QuotaError if the token's keys and `adding` more bytes (`what`) would pass its max_memory."""
    quota = read(client, token) if quota is None else quota
    if quota.max_memory is None:
        return
    held = held_bytes(client, token)
    if held + adding > quota.max_memory:
        raise QuotaError(f"token {token} holds {mib(held)} of its {mib(quota.max_memory)} memory quota "
                         f"({FLAG['max_memory']}); {what} need {mib(adding)} more: R.flush() graphs it no longer "
                         f"needs, or ask the admin to raise it (`ravop admin token set {token} --max-memory ...`)")


def time_refusal(token: str, used: float, quota: Quota) -> Optional[str]:
    """Why the token may run nothing more (its worker time is spent), or None."""
    if quota.max_worker_seconds is None or used < quota.max_worker_seconds:
        return None
    return (f"token {token} used {used:.1f} s of its {quota.max_worker_seconds:g} s worker-time quota "
            f"({FLAG['max_worker_seconds']}): stopped; ask the admin to raise it")


def running(client: Any, token: str, raw: Optional[Dict[bytes, bytes]] = None) -> Dict[str, str]:
    """worker -> "graph/subgraph" of the token's subgraphs live workers run now (from the usage hash, `raw` if read
    already); entries of workers no longer alive are left out."""
    raw = client.hgetall(usage_key(token)) if raw is None else raw
    held = {k.decode()[len(RUNNING):]: v.decode() for k, v in raw.items() if k.startswith(RUNNING.encode())}
    if not held:
        return {}
    pipe = client.pipeline(transaction=False)
    for name in held:
        pipe.exists(worker_key(name))
    return {w: what for (w, what), live in zip(held.items(), pipe.execute()) if live}


def worker_seconds(raw: Dict[bytes, bytes]) -> float:
    try:
        return float(raw.get(WORKER_SECONDS.encode(), 0))
    except ValueError:
        return 0.0


def shares(client: Any, tokens: Iterable[str]) -> List[Dict[str, Any]]:
    """Each token's weight, quotas, worker time used, its share of all worker time used, subgraphs running now and
    graphs its inbox holds back: what `ravop status` shows."""
    tokens = sorted(tokens)
    pipe = client.pipeline(transaction=False)
    for token in tokens:
        pipe.hgetall(quota_key(token))
        pipe.hgetall(usage_key(token))
    replies = pipe.execute()
    rows = []
    for i, token in enumerate(tokens):
        quota, usage = decode(replies[2 * i]), replies[2 * i + 1]
        rows.append({"token": token, **quota._asdict(), "worker_seconds": worker_seconds(usage),
                     "running": len(running(client, token, usage)), "held": int(usage.get(HELD.encode(), 0))})
    total = sum(row["worker_seconds"] for row in rows)
    for row in rows:
        row["share"] = row["worker_seconds"] / total if total else 0.0
    return rows
