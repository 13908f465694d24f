"""How a re-run of a loop segment votes when the bits may legitimately differ (issue 42): honest workers of
different numerics classes (ravop/core/numerics_class.py) part in the last bits, so a checker whose digest matches
no vote compares its carried values with each disputant's, from the same start state, and votes for the closest
within the graph's tolerance (spot_policy.scaled_difference); beyond it, it votes its own digest and stores its
values so that a tie-breaker can judge them too. The SPOT script still counts digests: a vote within tolerance is
a vote for that digest.

A disputant's values are a loop runner's checkpoint at the segment's end (its own state there), or those a run
stored under `values_key` (a plain subgraph's runner stores its outputs before it hands in their digest)."""
import logging
from typing import Any, Optional, Union

from ravop.core.spot_policy import scaled_difference
from ravop.store import GraphKeys
from ravop.store import tensors as stored
from ravop.store import votes as store_votes

from ..execute import device as devices
from ..loops.loop_subgraph import checkpoint_tensor_key

log = logging.getLogger("ravop.worker")


def values_key(keys: GraphKeys, subgraph_id: Union[int, str], segment: Optional[str], member: str, k: int) -> str:
    """Where run `member` keeps its k-th value of `segment` (None: a plain subgraph's outputs), under the
    subgraph's checkpoint keys: it goes when the graph's keys go."""
    return f"{keys.checkpoint(subgraph_id)}:check:{segment or 'outputs'}:{member}:{k}"


def store(worker: Any, keys: GraphKeys, subgraph_id: Union[int, str], segment: Optional[str],
          values: list[Any]) -> None:
    """Keep `worker`'s values of a checked result where a checker of another class can compare them."""
    pipe = worker.client.pipeline(transaction=False)
    for k, value in enumerate(values):
        stored.write(pipe, values_key(keys, subgraph_id, segment, worker.spot.member, k), value.contiguous())
    pipe.execute()


def _stored(client: Any, names: list[str]) -> Optional[list[Any]]:
    values = [stored.read(client, name) for name in names]
    return None if any(v is None for v in values) else values


def vote(worker: Any, keys: GraphKeys, subgraph_id: Union[int, str], segment: Optional[str], values: list[Any],
         digest: str, tolerance: float, runner_at: Optional[int] = None) -> str:
    """The digest `worker` votes for a result it computed as `values` (digest `digest`): its own where a vote
    has it (the same bits); else the closest other vote's within `tolerance`; else its own, its values stored
    for a tie-breaker. The runner of a loop segment ending at step `runner_at` is judged by its checkpoint
    there; every other run by the values it stored."""
    client = worker.client
    votes = store_votes.read(client, keys, subgraph_id, segment)
    runner = votes.get(b"#runner", b"").decode()
    by_digest: dict[str, str] = {}
    for voter, vote_digest in votes.items():
        if not voter.startswith(b"#"):
            by_digest.setdefault(vote_digest.decode(), voter.decode())
    if digest in by_digest:
        return digest   # bitwise equal: the same class's bits
    host = [devices.to_host(value) for value in values]
    best: Optional[tuple[float, str]] = None
    for theirs, member in by_digest.items():
        if member == runner and runner_at is not None:
            names = [checkpoint_tensor_key(keys, subgraph_id, runner_at, k) for k in range(len(host))]
        else:
            names = [values_key(keys, subgraph_id, segment, member, k) for k in range(len(host))]
        others = _stored(client, names)
        if others is None:
            continue
        distance = scaled_difference(host, others)
        log.warning("worker %s (%s): %s of subgraph %s of graph %s: %s's values are %.3g from this worker's "
                    "(tolerance %.3g)", worker.name, worker.numerics, f"segment {segment}" if segment else "outputs",
                    subgraph_id, keys.graph_id, member, distance, tolerance)
        if best is None or distance < best[0]:
            best = (distance, theirs)
    if best is not None and best[0] <= tolerance:
        return best[1]
    store(worker, keys, subgraph_id, segment, host)
    return digest


def adopted(worker: Any, keys: GraphKeys, subgraph_id: Union[int, str], vote: str,
            outputs: dict[int, Any]) -> dict[int, Any]:
    """The outputs of the run whose digest `vote` adopted (another numerics class's, within tolerance), as
    stored for this check, in place of this worker's own: the accepted result is that run's bits, which its
    voters seal (ravop.store.seals) and the one that completes stores. Its own if they are gone."""
    votes = store_votes.read(worker.client, keys, subgraph_id)
    member = next((m.decode() for m, d in votes.items() if not m.startswith(b"#") and d.decode() == vote), None)
    if member is None:
        return outputs
    others = _stored(worker.client, [values_key(keys, subgraph_id, None, member, k) for k in range(len(outputs))])
    return outputs if others is None else dict(zip(sorted(outputs), others))


def drop(client: Any, keys: GraphKeys, subgraph_id: Union[int, str], segment: Optional[str], n: int) -> None:
    """Delete the `n` values each voter on a settled result stored for its check."""
    voters = [m.decode() for m in client.hkeys(keys.votes(subgraph_id, segment)) if not m.startswith(b"#")]
    doomed = [key for member in voters for k in range(n)
              for key in stored.keys_of(values_key(keys, subgraph_id, segment, member, k))]
    if doomed:
        client.delete(*doomed)
