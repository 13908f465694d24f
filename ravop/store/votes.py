"""Votes a worker user cannot forge, and checks whose state it cannot write (issue 44). Under R.Graph(verify=k) and
verify='spot' each principal (a worker's ACL user, ravop.core.spot_policy.principal_of) votes in a key of its own,
`vote:{sid}[:{seg}]:{principal}`, that only that user may write, and only once: HSETNX is its only write grant
(ravop.store.access). Its fields: d (its digest), c (its numerics class), and under verify='spot' t (the server's
time of the vote), o (for the runner, the check's draw: checking or unchecked) and v (a deadline's verdict,
unverified or split, in the key of whoever ran the deadline check). The subgraph's `votes:{sid}[:{seg}]` hash only
names the voters: a name there counts only with a vote key of its own behind it, and no other field of it counts.

A spot check's state (who ran it, checking, confirmed, disputed, ...) is derived from those keys, each time, by the
SPOT script (ravop.store.spot_scripts.CHECK) and by `derive` here, the same rules: so a worker user can neither
write another user's part of a check (frame it, split or stall its check) nor turn its own check, once drawn,
into an accepted one. What it still can do (skip the script and claim an unchecked draw, or an unverified verdict,
in its own key) its requester finds when the graph ends: `drawn` is the draw, a function of the graph, the result
and the principal that anyone can recompute (ravop.client.bans.review). The threat model lists the rest
(docs/operators/security.md)."""
import hashlib
from typing import Dict, List, NamedTuple, Optional, Sequence, Union

from ..core.spot_policy import Verify
from .client_types import Client
from .keys import GraphKeys

Segment = Union[int, str, None]
FIELDS = ("d", "c", "t", "o", "v")
ACCEPTED = ("unchecked", "confirmed", "unverified")
OPEN = ("checking", "disputed")


class Ballot(NamedTuple):
    """One principal's vote key, as read."""
    digest: Optional[str]
    numerics_class: Optional[str]
    at: float
    draw: Optional[str]
    verdict: Optional[str]


class Check(NamedTuple):
    """A check's state derived from its ballots (None: nobody voted)."""
    state: Optional[str]
    accepted: Optional[str]
    runner: Optional[str]
    since: float
    digests: Dict[str, str]
    classes: Dict[str, str]
    draws: Dict[str, str]

    @property
    def losers(self) -> List[str]:
        return sorted(m for m, d in self.digests.items() if self.state == "confirmed" and d != self.accepted)


def derive(ballots: Dict[str, Ballot], copies: int, now: float) -> Check:
    """The state of a check from its voters' ballots: ravop.store.spot_scripts.CHECK's rules, in Python."""
    voters = {m: b for m, b in ballots.items() if b.digest is not None}
    verdicts = {b.verdict for b in ballots.values()}
    at = {m: 0.0 if b.at > now else b.at for m, b in voters.items()}   # a time to come was not the server's
    order = sorted(voters, key=lambda m: (at[m], m))
    drawn = [m for m in order if voters[m].draw]
    digests = {m: str(b.digest) for m, b in voters.items()}
    count: Dict[str, int] = {}
    for d in digests.values():
        count[d] = count.get(d, 0) + 1
    top = min(count, key=lambda d: (-count[d], d)) if count else None
    n, majority = len(voters), bool(count) and count[top] * 2 > len(voters)   # type: ignore[index]
    draws = {m: str(voters[m].draw) for m in drawn}
    if n == 0:
        state = None
    elif "split" in verdicts:
        state = "split"
    elif majority and n >= copies:
        state = "confirmed"
    elif majority and n == 1 and "unchecked" in draws.values() and "checking" not in draws.values():
        state = "unchecked"
    elif majority and "unverified" in verdicts:
        state = "unverified"
    elif majority:
        state = "checking"
    else:
        state = "split" if n >= copies + 2 else "disputed"
    since = at[order[0]] if order else now
    if state == "disputed":
        differing = [at[m] for m in order if digests[m] != digests[order[0]]]
        since = min(differing) if differing else since
    return Check(state, top if state in ACCEPTED else None, drawn[0] if drawn else None, since, digests,
                 {m: str(b.numerics_class) for m, b in voters.items() if b.numerics_class is not None}, draws)


def drawn(graph_id: str, subgraph_id: Union[int, str], segment: Segment, principal: str) -> float:
    """The SPOT script's draw for `principal`'s result (in [0, 1): checked below the policy's rate)."""
    text = f"{graph_id}/{subgraph_id}/{'' if segment is None else segment}/{principal}"
    return int(hashlib.sha1(text.encode()).hexdigest()[:8], 16) / 4294967296


def _text(value: Optional[bytes]) -> Optional[str]:
    return None if value is None else value.decode()


def ballots(client: Client, keys: GraphKeys, subgraph_id: Union[int, str], segments: Sequence[Segment]
            ) -> tuple[List[Dict[str, Ballot]], List[Dict[bytes, bytes]], float, Optional[bytes]]:
    """(ballots by principal, the votes hash's own `#` fields) of each check of `segments` (None: the subgraph's
    own), the server's time and the graph's policy: two round trips, whatever the number of checks."""
    pipe = client.pipeline(transaction=False)
    for segment in segments:
        pipe.hgetall(keys.votes(subgraph_id, segment))
    *listed, now, policy = pipe.time().get(keys.policy).execute()
    names = [[m.decode() for m in hashed if not m.startswith(b"#") and b":" not in m] for hashed in listed]
    pipe = client.pipeline(transaction=False)
    for segment, members in zip(segments, names):
        for member in members:
            pipe.hmget(keys.vote(subgraph_id, segment, member), *FIELDS)
    replies = iter(pipe.execute() if any(names) else [])
    found: List[Dict[str, Ballot]] = []
    for members in names:
        found.append({})
        for member in members:
            d, c, t, o, v = next(replies)
            try:
                at = float(t or 0)
            except ValueError:
                at = 0.0
            found[-1][member] = Ballot(_text(d), _text(c), at, _text(o), _text(v))
    seconds, micros = now
    return found, [{f: v for f, v in h.items() if f.startswith(b"#")} for h in listed], seconds + micros / 1e6, policy


def copies_of(policy: Optional[bytes]) -> int:
    """The runs a check compares under the graph's policy (2 where it has none)."""
    return Verify.decode(policy).copies if policy else 2


def checks(client: Client, keys: GraphKeys, subgraph_id: Union[int, str], segments: Sequence[Segment]
           ) -> Dict[Segment, Check]:
    """The states of a subgraph's checks (its own: None, or its loop's segments) as the SPOT script derives them."""
    found, _, now, policy = ballots(client, keys, subgraph_id, segments)
    return {segment: derive(b, copies_of(policy), now) for segment, b in zip(segments, found)}


def check(client: Client, keys: GraphKeys, subgraph_id: Union[int, str], segment: Segment = None) -> Check:
    """A check's state as the SPOT script derives it."""
    return checks(client, keys, subgraph_id, [segment])[segment]


def read(client: Client, keys: GraphKeys, subgraph_id: Union[int, str], segment: Segment = None) -> Dict[bytes, bytes]:
    """The check as its readers know it: per principal that voted its digest (and '#c:{principal}', its class);
    under verify='spot' the derived state as '#state', '#runner', '#accepted', '#losers', '#since', and the hash's
    '#narrowed' fields."""
    [found], [own], now, policy = ballots(client, keys, subgraph_id, [segment])
    merged = {f: v for f, v in own.items() if f.startswith(b"#narrowed")}
    derived = derive(found, copies_of(policy), now)
    for member, d in derived.digests.items():
        merged[member.encode()] = d.encode()
    for member, c in derived.classes.items():
        merged[b"#c:" + member.encode()] = c.encode()
    if policy is None:   # R.Graph(verify=k): the votes only
        return merged
    fields = {"#state": derived.state, "#runner": derived.runner, "#accepted": derived.accepted,
              "#losers": ",".join(derived.losers) if derived.losers else None,
              "#since": repr(derived.since) if derived.digests else None}
    merged.update({k.encode(): v.encode() for k, v in fields.items() if v is not None})
    return merged


def digests(client: Client, keys: GraphKeys, subgraph_id: Union[int, str],
            segment: Segment = None) -> Dict[str, str]:
    """{principal: digest} of the votes on a subgraph (or segment)."""
    return {m.decode(): d.decode() for m, d in read(client, keys, subgraph_id, segment).items()
            if not m.startswith(b"#")}
