"""How a re-run of a loop segment votes when the bits may legitimately differ (issue 42): honest workers of
different numerics classes (ravop/core/numerics_class.py) part in the last bits, so a checker whose digest matches
no vote compares its carried values with each disputant's, from the same start state, and votes for the closest
within the graph's tolerance (spot_policy.scaled_difference); beyond it, it votes its own digest and stores its
values so that a tie-breaker can judge them too. The SPOT script still counts digests: a vote within tolerance is
a vote for that digest.

A disputant's values are the runner's checkpoint at the segment's end (the runner's own state there), or those a
checker stored under `values_key`."""
import logging
from typing import Any, Optional, Union

from ravop.core.spot_policy import scaled_difference
from ravop.store import GraphKeys
from ravop.store import tensors as stored

from ..execute import device as devices
from ..loops.loop_subgraph import checkpoint_tensor_key

log = logging.getLogger("ravop.worker")


def values_key(keys: GraphKeys, subgraph_id: Union[int, str], segment: str, member: str, k: int) -> str:
    """Where checker `member` keeps its k-th carried value of `segment` (under the loop's checkpoint keys: it
    goes when the graph's keys go)."""
    return f"{keys.checkpoint(subgraph_id)}:check:{segment}:{member}:{k}"


def _values_of(client: Any, keys: GraphKeys, subgraph_id: Union[int, str], segment: str, member: str, runner: str,
               end: int, n: int) -> Optional[list[Any]]:
    """`member`'s carried values at the end of `segment`; None if they are gone (or were never stored)."""
    names = [checkpoint_tensor_key(keys, subgraph_id, end, k) if member == runner
             else values_key(keys, subgraph_id, segment, member, k) for k in range(n)]
    values = [stored.read(client, name) for name in names]
    return None if any(v is None for v in values) else values


def vote(worker: Any, keys: GraphKeys, subgraph_id: Union[int, str], segment: str, end: int, carried: list[Any],
         digest: str, tolerance: float) -> str:
    """The digest `worker` votes for the segment whose carried values it computed as `carried` (digest
    `digest`): a disputant's when within `tolerance` (the closest), else its own, its values stored."""
    client = worker.client
    votes = client.hgetall(keys.votes(subgraph_id, segment))
    runner = votes.get(b"#runner", b"").decode()
    by_digest: dict[str, str] = {}
    for member, theirs in votes.items():
        if not member.startswith(b"#"):
            by_digest.setdefault(theirs.decode(), member.decode())
    if digest in by_digest:
        return digest   # bitwise equal: the same class's bits
    host = [devices.to_host(value) for value in carried]
    best: Optional[tuple[float, str]] = None
    for theirs, member in by_digest.items():
        values = _values_of(client, keys, subgraph_id, segment, member, runner, end, len(host))
        if values is None:
            continue
        distance = scaled_difference(host, values)
        log.warning("worker %s (%s): segment %s of loop subgraph %s of graph %s: %s's values are %.3g from this "
                    "worker's (tolerance %.3g)", worker.name, worker.numerics, segment, subgraph_id, keys.graph_id,
                    member, distance, tolerance)
        if best is None or distance < best[0]:
            best = (distance, theirs)
    if best is not None and best[0] <= tolerance:
        return best[1]
    pipe = client.pipeline(transaction=False)
    for k, value in enumerate(host):
        stored.write(pipe, values_key(keys, subgraph_id, segment, worker.spot.member, k), value.contiguous())
    pipe.execute()
    return digest
