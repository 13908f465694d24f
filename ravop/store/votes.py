"""Votes a worker user cannot forge (issue 44). Under R.Graph(verify=k) and verify='spot' each principal (a worker's
ACL user, ravop.core.spot_policy.principal_of) votes in a key of its own, `vote:{sid}[:{seg}]:{principal}`, a hash
of d (its digest) and c (its numerics class), that only that user may write, and only once: HSETNX is its only
write grant (ravop.store.access). The subgraph's `votes:{sid}[:{seg}]` hash names the voters and keeps the SPOT
script's state; any worker user may write it (scripts run with their caller's permissions, and every worker runs
the scripts), so a name there counts only with a vote key of its own behind it.

So a worker user cannot overwrite or add another user's vote (to frame an honest worker or split a check), nor
change its own after the count (to escape a ban). What it still can do to the state fields is listed in the threat
model (docs/operators/security.md)."""
from typing import Dict, Union

from .client_types import Client
from .keys import GraphKeys

Segment = Union[int, str, None]


def read(client: Client, keys: GraphKeys, subgraph_id: Union[int, str], segment: Segment = None) -> Dict[bytes, bytes]:
    """The check's hash as its readers know it: its state fields ('#...'), and per principal that voted its
    digest (and '#c:{principal}', its class), each from the principal's own vote key. Two round trips."""
    listed = client.hgetall(keys.votes(subgraph_id, segment))
    merged = {f: v for f, v in listed.items() if f.startswith(b"#") and not f.startswith(b"#c:")}
    voters = [m for m in listed if not m.startswith(b"#") and b":" not in m]
    if not voters:
        return merged
    pipe = client.pipeline(transaction=False)
    for member in voters:
        pipe.hmget(keys.vote(subgraph_id, segment, member.decode()), "d", "c")
    for member, (digest, numerics_class) in zip(voters, pipe.execute()):
        if digest is not None:
            merged[member] = digest
            if numerics_class is not None:
                merged[b"#c:" + member] = numerics_class
    return merged


def digests(client: Client, keys: GraphKeys, subgraph_id: Union[int, str],
            segment: Segment = None) -> Dict[str, str]:
    """{principal: digest} of the votes on a subgraph (or segment)."""
    return {m.decode(): d.decode() for m, d in read(client, keys, subgraph_id, segment).items()
            if not m.startswith(b"#")}