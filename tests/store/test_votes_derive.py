"""A spot check's state has two derivations from the voters' own keys (issue 44): the SPOT script's CHECK, which the
workers' decisions follow, and ravop.store.votes.derive, which the requester's review and the workers' readers use.
They must agree on every set of ballots, hostile ones included (forged times, extra draws, verdicts without
votes, names without keys): checked here on seeded random ballots against the real server's Lua."""
import random

from ravop.store import GraphKeys, votes
from ravop.store.spot_scripts import CHECK

# CHECK's state of one check, as the server's Lua computes it (the state's fields as strings).
RUN_CHECK = CHECK + """
local t = redis.call('TIME')
local now = tonumber(ARGV[3]) or (tonumber(t[1]) + tonumber(t[2]) / 1000000)
local c = check_of(KEYS[1], ARGV[1], tonumber(ARGV[2]), now)
return {c.state or '', c.accepted or '', c.runner or '', string.format('%.6f', c.since)}
"""


def random_ballots(rng: random.Random, now: float) -> dict:
    """{principal: {field: value}} of up to 6 voters, some of them hostile."""
    ballots = {}
    for k in range(rng.randint(0, 6)):
        fields = {}
        if rng.random() < 0.9:
            fields["d"] = rng.choice(["a" * 64, "b" * 64, "c" * 64])
            fields["c"] = rng.choice(["cpu/x", "cpu/y"])
            fields["t"] = rng.choice([f"{now - rng.uniform(0, 100):.6f}", f"{now + 1e6:.6f}", "0", "junk"])
        if rng.random() < 0.4:
            fields["o"] = rng.choice(["checking", "unchecked"])
        if rng.random() < 0.15:
            fields["v"] = rng.choice(["unverified", "split"])
        ballots[f"p{k}"] = fields
    return ballots


def test_the_script_and_the_readers_derive_the_same_state(client):
    rng = random.Random(44)
    script = client.register_script(RUN_CHECK)
    keys = GraphKeys("derive", "g")
    seen = set()
    for case in range(400):
        now = 1.7e9 + case
        ballots = random_ballots(rng, now)
        copies = rng.choice([2, 3])
        pipe = client.pipeline(transaction=False)
        for member, fields in ballots.items():
            pipe.hset(keys.votes(case), member, 1)
            if fields:
                pipe.hset(keys.vote(case, None, member), mapping=fields)
        pipe.hset(keys.votes(case), "#state", "confirmed")   # a forged field of the old design: no effect
        pipe.execute()
        state, accepted, runner, since = (v.decode() for v in script(keys=[keys.votes(case)],
                                                                     args=[keys.vote(case), copies, repr(now)]))
        [found], _, _, _ = votes.ballots(client, keys, case, [None])
        derived = votes.derive(found, copies, now)
        assert (derived.state or "", derived.accepted or "", derived.runner or "") == (state, accepted, runner), \
            (case, ballots, copies)
        assert abs(derived.since - float(since)) < 1e-5, (case, ballots)
        seen.add(derived.state)
    assert seen == {None, "checking", "unchecked", "confirmed", "disputed", "split", "unverified"}
