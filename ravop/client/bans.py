"""A token's bans, written by its own requester on the evidence of the votes (issue 44). A worker user may read
but not write any token's banned set (ravop.store.access): scripts run with their caller's ACL, so a ban the SPOT
or verify scripts could write, a raw SADD of the same worker user could write too, and one such SADD stopped all of
a token's graphs. So the scripts only record the votes (each principal's digest of each checked result, in a key
only that principal's user may write, once: ravop.store.votes), and when a graph under R.Graph(verify=k) or
verify='spot' ends, its requester bans the principals that a strict majority of the other principals' digests
outvoted (ravop.core.spot_policy.tally). While a graph's work waits and every
connected worker is banned from the token's work, the requester says so, naming them and why."""
from typing import List

from ..core.spot_policy import tally
from ..store import GraphKeys, TokenKeys
from ..store import votes, worker_info
from .session import Session

REASON = ("outvoted: its results differed from a strict majority of other workers' under R.Graph(verify=...); "
          "bans are this token's own (SREM the principal from its `banned` set to lift one)")


def apply(session: Session, keys: GraphKeys) -> List[str]:
    """Ban, for the token, the principals the ended graph's votes outvoted; the ones banned now."""
    client = session.client
    copies, spot = client.hmget(keys.meta, "verify", "spot")
    if int(copies or 1) < 2 and not spot:
        return []
    outvoted = set()
    for key in client.scan_iter(match=keys.votes("*"), count=1000):
        # votes:{sid} or votes:{sid}:{seg}; each principal's digest is in its own key (ravop.store.votes)
        subgraph_id, _, segment = key.decode()[len(keys.votes("")):].partition(":")
        outvoted.update(tally(votes.digests(client, keys, subgraph_id, segment or None))[1])
    if not outvoted:
        return []
    banned = TokenKeys(keys.token).banned
    fresh = [p for p in sorted(outvoted) if not client.sismember(banned, p)]
    if fresh:
        client.sadd(banned, *fresh)
    return fresh


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
