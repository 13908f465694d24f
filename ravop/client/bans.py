"""A token's bans, written by its own requester on the evidence of the votes (issue 44). A worker user may read
but not write any token's banned set (ravop.store.access): scripts run with their caller's ACL, so a ban the SPOT
or verify scripts could write, a raw SADD of the same worker user could write too, and one such SADD stopped all of
a token's graphs. So the scripts only record the votes (each principal's digest of each checked result, in a key
only that principal's user may write, once: ravop.store.votes), and when a graph under R.Graph(verify=k) or
verify='spot' ends, its requester bans the principals that a strict majority of the other principals' digests
outvoted (ravop.core.spot_policy.tally). Under verify='spot' it also reviews each check (`review`): a result its
runner claimed unchecked where the draw, which anyone can recompute (ravop.store.votes.drawn), asked for a check,
or a check still open when the graph ended done, raises CheckSkipped from R.track_progress and bans the claimant;
results accepted unverified are listed. While a graph's work waits and every connected worker is banned from the
token's work, the requester says so, naming them and why."""
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

from ..core.errors import GraphStateError
from ..core.spot_policy import Verify, tally
from ..store import GraphKeys, TokenKeys
from ..store import votes, worker_info
from .session import Session

REASON = ("outvoted: its results differed from a strict majority of other workers' under R.Graph(verify=...); "
          "bans are this token's own (SREM the principal from its `banned` set to lift one)")
SKIPPED = ("skipped a spot check: it claimed a result unchecked that its draw had checked (ravop.store.votes.drawn); "
           "bans are this token's own (SREM the principal from its `banned` set to lift one)")


class CheckSkipped(GraphStateError):
    """A graph under verify='spot' ended with a result that skipped the check its draw asked for, or whose check
    was still open: its values cannot be trusted."""


class Review(NamedTuple):
    """What the votes of an ended graph say: principals banned now for being outvoted, and for skipping a check;
    checks skipped (each a sentence); results accepted unverified (each a sentence: no worker of another user re-ran
    them)."""
    outvoted: List[str]
    skippers: List[str]
    skipped: List[str]
    unverified: List[str]


def _checks(client: Any, keys: GraphKeys) -> Dict[Tuple[str, Optional[str]], votes.Check]:
    """Every check of the graph (subgraph id, segment or None), derived from its voters' own keys."""
    by_subgraph: Dict[str, List[Optional[str]]] = {}
    for key in client.scan_iter(match=keys.votes("*"), count=1000):
        # votes:{sid} or votes:{sid}:{seg}; each principal's vote is in its own key (ravop.store.votes)
        subgraph_id, _, segment = key.decode()[len(keys.votes("")):].partition(":")
        by_subgraph.setdefault(subgraph_id, []).append(segment or None)
    return {(sid, segment): check for sid, segments in by_subgraph.items()
            for segment, check in votes.checks(client, keys, sid, segments).items()}


def _what(subgraph_id: Union[int, str], segment: Optional[str]) -> str:
    return f"subgraph {subgraph_id}" + ("" if segment is None else f" segment {segment}")


def review(session: Session, keys: GraphKeys, done: bool = True) -> Review:
    """Ban, for the token, the principals the ended graph's votes outvoted, and those that skipped a spot check its
    draw asked for (a raw claim in their own vote key, which the SPOT script would not have written); list the
    checks skipped, or still open when the graph ended `done`, and the results accepted unverified."""
    client = session.client
    copies, spot = client.hmget(keys.meta, "verify", "spot")
    if int(copies or 1) < 2 and not spot:
        return Review([], [], [], [])
    policy = client.get(keys.policy)   # the requester's own record: the meta's copy is writable by workers
    rate = Verify.decode(policy).rate if policy else None
    checks = _checks(client, keys)
    outvoted = set()
    for check in checks.values():
        outvoted.update(tally(check.digests)[1])
    skipped, culprits, unverified = [], set(), []
    for (sid, segment), check in sorted(checks.items(), key=lambda item: (item[0][0], item[0][1] or "")):
        if rate is None or check.runner is None:
            continue
        draw = votes.drawn(keys.graph_id, sid, segment, check.runner)
        if check.state == "unchecked" and draw < rate:
            culprits.add(check.runner)
            skipped.append(f"{_what(sid, segment)}: {check.runner} claimed it unchecked, but its draw ({draw:.3f}, "
                           f"under the rate {rate:g}) asked for a check by another user's worker")
        elif done and check.state in votes.OPEN and check.runner not in outvoted:
            skipped.append(f"{_what(sid, segment)}: its check by other users' workers was still {check.state} when "
                           f"the graph ended: {check.runner}'s result was used before it settled")
        elif check.state == "unverified":
            unverified.append(f"{_what(sid, segment)}: {check.runner}'s result (no worker of another user re-ran it "
                              "within the settle time)")
    banned = TokenKeys(keys.token).banned
    fresh = [p for p in sorted(outvoted | culprits) if not client.sismember(banned, p)]
    if fresh:
        client.sadd(banned, *fresh)
    return Review([p for p in fresh if p in outvoted], [p for p in fresh if p in culprits], skipped, unverified)


def waiting(session: Session, keys: GraphKeys) -> str:
    """Why the graph's work waits if every connected worker is banned from its token's work, else ''."""
    banned = {b.decode() for b in session.client.smembers(TokenKeys(keys.token).banned)}
    if not banned:
        return ""
    live = {str(info.get("principal") or info.get("name")) for info in worker_info.read_all(session.client)}
    if not live or not live <= banned:
        return ""
    return (f"every connected worker is banned from the work of token {keys.token!r} ({', '.join(sorted(live))}: "
            f"{REASON})")
