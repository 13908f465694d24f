"""A spot check's state that a worker user cannot write (issue 44), on a real server with `ravop admin` users: the
state is derived from each voter's own write-once key (ravop.store.votes), so fields written into the shared votes
hash count for nothing, another user's vote key is refused, a runner's drawn check cannot be turned into an accepted
one, a check's deadline cannot be pushed away, and what a worker user can still claim in its own key (an unchecked
draw, or a check left open) its requester finds when the graph ends (ravop.client.bans.review): it names the
checks, bans the claimant and R.track_progress raises CheckSkipped."""
import time

import pytest
import redis
import torch

import ravop as R
from ravop.client import bans
from ravop.client.session import require
from ravop.store import TokenKeys, votes
from ravop.store.spot_scripts import SpotScript

from test_security import create_user, users  # noqa: F401  (users: two token users and a worker user)

HONEST, LIE = "a" * 64, "f" * 64
DENIED = redis.exceptions.NoPermissionError


@pytest.fixture
def setting(server, users, tmp_path):  # noqa: F811
    """(keys of an activated graph of token user A under verify='spot' with every result drawn checked and 1 s to
    settle, {role: (principal, client)}: the attacker (the fixture's worker user), an honest user and a third)."""
    names, urls, pool = users
    pool.stop_all()     # the script's calls are made here, as each user: no worker takes the re-runs it enqueues
    others = {role: names["w"].replace("prov", f"prov-{role}") for role in ("honest", "third")}
    clients = {"attacker": (names["w"], redis.Redis.from_url(urls["w"]))}
    for role, name in others.items():
        clients[role] = (name, redis.Redis.from_url(create_user(server.url, "worker", name)))
    R.initialize(redis_url=urls["a"])
    R.Graph(name="checked", verify=R.Verify(rate=1.0, trust_after=0, settle_seconds=1.0))
    x = R.t(torch.full((128, 128), 2.0))
    (x @ x).persist_op("product")
    R.activate()
    yield require().keys(), clients
    admin = redis.Redis.from_url(server.url)
    for name, client in clients.values():
        client.close()
        if name in others.values():
            admin.execute_command("ACL", "DELUSER", name)
    admin.close()


def vote(clients, role, keys, subgraph_id, digest):
    principal, client = clients[role]
    return SpotScript(client).submit(keys, subgraph_id, principal, digest, "cpu")


def test_a_worker_user_cannot_forge_another_s_check_nor_win_it_by_writing_state(setting):
    keys, clients = setting
    attacker, client = clients["attacker"]
    honest = clients["honest"][0]
    assert vote(clients, "honest", keys, 0, HONEST) == ["hold"]     # drawn checked: a re-run by another user
    # the old state fields, written into the shared hash: no HSET there any more, and what HSETNX (which names
    # the voters) adds counts for nothing
    with pytest.raises(DENIED):
        client.hset(keys.votes(0), "#state", "confirmed")
    for field, value in {"#state": "confirmed", "#accepted": LIE, "#losers": honest, "#runner": attacker,
                         "ghost": 1}.items():
        assert client.hsetnx(keys.votes(0), field, value) == 1
    check = votes.check(client, keys, 0)
    assert (check.state, check.runner, check.accepted, check.digests) == ("checking", honest, None, {honest: HONEST})
    for command in (client.hset, client.hsetnx):    # the honest user's own part of the check: refused
        with pytest.raises(DENIED):
            command(keys.vote(0, None, honest), "v", "split")
    assert vote(clients, "attacker", keys, 0, LIE) == ["hold"]     # its own vote: a dispute, not a win
    assert votes.check(client, keys, 0).state == "disputed"
    assert vote(clients, "third", keys, 0, HONEST) == ["confirmed", attacker]
    check = votes.check(client, keys, 0)
    assert (check.state, check.accepted, check.losers) == ("confirmed", HONEST, [attacker])
    review = bans.review(require(), keys)
    assert review.outvoted == [attacker] and review.skippers == [] and review.skipped == []


def test_a_runner_cannot_end_its_own_check_accepted_without_a_re_run(setting):
    keys, clients = setting
    attacker, client = clients["attacker"]
    assert vote(clients, "attacker", keys, 1, LIE) == ["hold"]     # drawn checked
    for field, value in (("#state", "unchecked"), ("#accepted", LIE)):   # as it could before, with HSET
        client.hsetnx(keys.votes(1), field, value)
    assert client.hsetnx(keys.vote(1, None, attacker), "o", "unchecked") == 0      # its draw is written once
    with pytest.raises(DENIED):
        client.hset(keys.vote(1, None, attacker), "o", "unchecked")
    assert votes.check(client, keys, 1).state == "checking"
    # skipping the script: its own vote key written by hand, claiming a draw that asked for no check
    now = "%.6f" % time.time()
    for field, value in (("d", LIE), ("c", "cpu"), ("t", now), ("o", "unchecked")):
        assert client.hsetnx(keys.vote(2, None, attacker), field, value) == 1
    client.hsetnx(keys.votes(2), attacker, 1)
    assert votes.check(client, keys, 2).state == "unchecked"     # the claim stands in the store...
    assert votes.drawn(keys.graph_id, 2, None, attacker) < 1.0
    review = bans.review(require(), keys)    # ...and its requester finds both when the graph ends
    assert review.skippers == [attacker] and review.outvoted == []
    assert any(s.startswith(f"subgraph 1: its check by other users' workers was still checking when the graph ended: "
                            f"{attacker}'s result was used before it settled") for s in review.skipped)
    assert any(s.startswith(f"subgraph 2: {attacker} claimed it unchecked, but its draw") for s in review.skipped)
    assert require().client.sismember(TokenKeys(keys.token).banned, attacker)
    require().client.hset(keys.meta, "state", "done")   # as when its workers complete it: the tracker raises
    with pytest.raises(bans.CheckSkipped, match=rf"graph 'checked' ended, but a worker user skipped its spot checks "
                                                rf".*subgraph 2: {attacker} claimed it unchecked"):
        R.track_progress(progress_bar=False, timeout=10)


def test_a_worker_user_cannot_stall_a_check_past_its_deadline(setting):
    keys, clients = setting
    attacker, client = clients["attacker"]
    honest = clients["honest"][0]
    assert vote(clients, "honest", keys, 3, HONEST) == ["hold"]
    for field, value in (("#since", "9e12"), ("#state", "checking")):   # the deadline pushed away, as before
        client.hsetnx(keys.votes(3), field, value)
    time.sleep(1.2)
    assert vote(clients, "honest", keys, 3, "")[0] == "unverified"   # 1 s after the vote, as the policy says
    assert votes.check(client, keys, 3).state == "unverified"
    # a dispute whose attacker's vote says it came in the future: the deadline is counted from no later than now
    assert vote(clients, "honest", keys, 4, HONEST) == ["hold"]
    for field, value in (("d", LIE), ("c", "cpu"), ("t", "9e12")):
        client.hsetnx(keys.vote(4, None, attacker), field, value)
    client.hsetnx(keys.votes(4), attacker, 1)
    assert votes.check(client, keys, 4).state == "disputed"
    assert vote(clients, "honest", keys, 4, "")[0] == "hold"   # the honest vote's own time: 1 s to break the tie
    time.sleep(1.2)
    assert sorted(vote(clients, "honest", keys, 4, "")) == sorted(["split", honest, attacker])
    review = bans.review(require(), keys)
    assert review.unverified == [f"subgraph 3: {honest}'s result (no worker of another user re-ran it within the "
                                 "settle time)"]
