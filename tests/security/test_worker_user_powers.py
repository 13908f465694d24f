"""What a worker user may no longer decide for a token (issue 44), on a real server with `ravop admin` users and
real worker processes: it may not ban a token's workers (a raw SADD is refused; a token's bans are its requester's,
on the votes' evidence), a graph stopped by bans says who is banned and why instead of timing out silently, a
result it overwrites after the vote is refused at fetch (ravop.store.seals), a vote it forges for another user, adds
for an invented one or rewrites after the count is refused or counts for nothing (ravop.store.votes), and a start
it drops from a token's inbox is posted again by the requester, which names the attack if it keeps happening, and a
constant it overwrites after the upload fails the subgraph that reads it (ravop.store.seals)."""
import threading
import time

import pytest
import redis
import torch

import ravop as R
from ravop.core.errors import GraphFailedError, GraphStateError
from ravop.record.loop import Loop
from ravop.client import bans
from ravop.client.session import require
from ravop.store import Scripts, TokenKeys, votes
from ravop.store.seals import SealBroken, digest
from ravop.wire import encode_tensor

from conftest import Workers
from test_security import create_user, run_graph, users  # noqa: F401  (users: two token users and a worker user)


def record_graph(name):
    R.Graph(name=name)
    x = R.t(torch.full((128, 128), 2.0))
    (x @ x).persist_op("product")
    assert R.activate()["subgraphs"] == 1


def test_a_worker_user_may_not_ban_and_a_graph_stopped_by_bans_says_why(server, users):  # noqa: F811
    names, urls, _ = users
    banned = TokenKeys(names["a"]).banned
    attacker = redis.Redis.from_url(urls["w"])
    with pytest.raises(redis.exceptions.NoPermissionError):
        attacker.sadd(banned, "h0", "h1")
    assert attacker.sismember(banned, "h0") == 0   # it still reads them: its worker honours them
    attacker.close()

    R.initialize(redis_url=urls["a"])
    assert torch.equal(run_graph("before", 1), torch.full((128, 128), 128.0))
    owner = redis.Redis.from_url(urls["a"])
    owner.sadd(banned, names["w"])      # the token's own ban of the only worker user
    time.sleep(2.5)     # a worker's knowledge of a ban may be BAN_CHECK_SECONDS (2 s) stale
    record_graph("stopped")
    R.execute()
    with pytest.raises(TimeoutError, match=f"every connected worker is banned from the work of token '{names['a']}' "
                                           rf"\({names['w']}: outvoted"):
        R.track_progress(progress_bar=False, timeout=6)
    owner.srem(banned, names["w"])      # lifted by its owner: the graph runs
    R.track_progress(progress_bar=False, timeout=120)
    assert torch.equal(R.fetch_persisting_op("product"), torch.full((128, 128), 4.0 * 128))
    owner.close()


def test_a_start_dropped_from_the_inbox_is_posted_again_or_named(server, users, capsys):  # noqa: F811
    names, urls, pool = users
    pool.stop_all()     # nobody starts it while the attacker drops it
    R.initialize(redis_url=urls["a"])
    record_graph("dropped")
    inbox = TokenKeys(names["a"]).inbox
    attacker = redis.Redis.from_url(urls["w"])
    stop = threading.Event()

    def drop():
        while not stop.is_set():
            for graph_id in attacker.zrange(inbox, 0, -1):
                attacker.zrem(inbox, graph_id)
            stop.wait(0.002)

    R.execute()
    dropper = threading.Thread(target=drop)
    dropper.start()
    try:
        with pytest.raises(GraphStateError, match=rf"start was removed from the inbox of token '{names['a']}' 4 times "
                                                  "without being started: a worker user is dropping it"):
            R.track_progress(progress_bar=False, timeout=60)
    finally:
        stop.set()
        dropper.join()
    attacker.close()
    assert "posted again" in capsys.readouterr().err
    pool.start(1)
    R.track_progress(progress_bar=False, timeout=120)   # dropped once more (the last time): posted again, and run
    assert "posted again" in capsys.readouterr().err
    assert torch.equal(R.fetch_persisting_op("product"), torch.full((128, 128), 4.0 * 128))


def run_a_voted_product(url, name):
    """A one-subgraph graph of token user `url` run under verify=2 (each subgraph voted on by workers of 2 users)."""
    R.initialize(redis_url=url)
    R.Graph(name=name, verify=2)
    x = R.t(torch.full((128, 128), 2.0))
    (x @ x).persist_op("product")
    assert R.activate()["subgraphs"] == 1
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)


def test_a_result_overwritten_after_the_vote_is_refused_at_fetch(server, users, tmp_path):  # noqa: F811
    names, urls, _ = users
    other = names["w"].replace("prov", "prov2")
    honest = Workers(create_user(server.url, "worker", other), tmp_path)
    honest.start(1)     # verify=2 runs each subgraph on workers of 2 users
    try:
        run_a_voted_product(urls["a"], "sealed")
        truth = torch.full((128, 128), 4.0 * 128)
        assert torch.equal(R.fetch_persisting_op("product"), truth)
        keys = R.initialize(redis_url=urls["a"]).keys()
        node = int(redis.Redis.from_url(urls["a"]).hget(keys.persist, "product"))
        attacker = redis.Redis.from_url(urls["w"])
        forged = torch.full((128, 128), 12345.0)
        attacker.set(keys.tensor(node), encode_tensor(forged))   # granted: workers store outputs
        with pytest.raises(SealBroken, match=rf"'product' \(node {node} of graph {keys.graph_id}\) was changed "
                                             "after the vote: its stored value's digest"):
            R.fetch_persisting_op("product")
        with pytest.raises(redis.exceptions.NoPermissionError):   # the other user's seal is not its own
            attacker.set(keys.seal(node, other), "0" * 64)
        attacker.set(keys.seal(node, names["w"]), digest(forged))   # its own: one vote against one
        with pytest.raises(SealBroken, match="recorded no strict majority's digest at the vote"):
            R.fetch_persisting_op("product")
        attacker.close()
    finally:
        honest.stop_all()
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("ACL", "DELUSER", other)
        admin.close()


def test_a_worker_user_cannot_forge_add_or_rewrite_votes(server, users, tmp_path):  # noqa: F811
    names, urls, _ = users
    mine = names["w"]
    other = mine.replace("prov", "prov3")
    other_url = create_user(server.url, "worker", other)
    honest = Workers(other_url, tmp_path)
    honest.start(1)     # verify=2: each subgraph voted on by both users
    try:
        run_a_voted_product(urls["a"], "voted")
        session = require()
        keys = session.keys()
        cast = votes.digests(session.client, keys, 0)
        assert set(cast) == {mine, other} and len(set(cast.values())) == 1
        [agreed] = set(cast.values())
        attacker = redis.Redis.from_url(urls["w"])
        lie = "f" * 64
        denied = redis.exceptions.NoPermissionError
        for command in (attacker.hset, attacker.hsetnx):    # another user's vote: neither rewritten nor forged
            with pytest.raises(denied):
                command(keys.vote(0, None, other), "d", lie)
            with pytest.raises(denied):   # nor one for a principal it invents
                command(keys.vote(0, None, "ghost"), "d", lie)
        with pytest.raises(denied):     # its own vote is written once: no HSET, no DEL
            attacker.hset(keys.vote(0, None, mine), "d", lie)
        with pytest.raises(denied):
            attacker.delete(keys.vote(0, None, mine))
        assert attacker.hsetnx(keys.vote(0, None, mine), "d", lie) == 0
        # the voters' hash takes new names (HSETNX: the scripts name the voters there): they count only with a vote
        with pytest.raises(denied):
            attacker.hset(keys.votes(0), mine, lie)
        for name in ("ghost", "ghost2"):
            attacker.hsetnx(keys.votes(0), name, lie)
        assert votes.digests(session.client, keys, 0) == {mine: agreed, other: agreed}
        assert bans.review(session, keys).outvoted == [] and not session.client.smembers(TokenKeys(names["a"]).banned)
        assert torch.equal(R.fetch_persisting_op("product"), torch.full((128, 128), 4.0 * 128))

        # the count of R.Graph(verify=k) is not filled by invented voters: a lone vote waits for a real second
        attacker.hsetnx(keys.votes(7), "ghost", lie)
        attacker.hsetnx(keys.votes(7), "ghost2", lie)
        assert Scripts(attacker).vote(keys, 7, mine, lie, 2) == {}
        assert Scripts(attacker).vote(keys, 7, mine, "0" * 64, 2) == {}    # a second try keeps its first vote
        defender = redis.Redis.from_url(other_url)
        assert Scripts(defender).vote(keys, 7, other, agreed, 2) == {mine: lie, other: agreed}
        # a script runs with its caller's rights: no vote in another's name
        with pytest.raises(redis.exceptions.ResponseError, match="ACL failure in script"):
            Scripts(attacker).vote(keys, 8, other, lie, 1)
        defender.close()
        attacker.close()
    finally:
        honest.stop_all()
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("ACL", "DELUSER", other)
        admin.close()


def test_a_loop_s_values_overwritten_after_a_spot_checked_loop_are_refused_at_fetch(server, users,  # noqa: F811
                                                                                 no_loop_folding):
    names, urls, _ = users
    R.initialize(redis_url=urls["a"])
    R.Graph(name="sealed-loop", verify=R.Verify(rate=0.0, trust_after=0))   # every segment accepted unchecked
    loop = Loop([R.t(torch.full((64, 64), 1.0))])
    with loop.step() as step:
        (w,) = step.carried
        step.persist(w, [f"w_{k}" for k in range(3)])
        step.carry([w * 2.0])
    [final] = loop.run([(0, 3)])
    final.persist_op("final")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    assert torch.equal(R.fetch_persisting_op("final"), torch.full((64, 64), 8.0))
    keys = require().keys()
    node = int(redis.Redis.from_url(urls["a"]).hget(keys.persist, "final"))
    attacker = redis.Redis.from_url(urls["w"])
    attacker.set(keys.tensor(node), encode_tensor(torch.full((64, 64), 12345.0)))
    with pytest.raises(SealBroken, match=rf"'final' \(node {node} of graph {keys.graph_id}\) was changed after the "
                                         "vote"):
        R.fetch_persisting_op("final")
    assert torch.equal(R.fetch_persisting_op("w_1"), torch.full((64, 64), 2.0))   # what a step persisted: sealed too
    step_value = int(redis.Redis.from_url(urls["a"]).hget(keys.persist, "w_1"))
    attacker.set(keys.tensor(step_value), encode_tensor(torch.full((64, 64), 12345.0)))
    with pytest.raises(SealBroken, match=r"'w_1' .* was changed after the vote"):
        R.fetch_persisting_op("w_1")
    attacker.close()


def test_a_constant_overwritten_after_upload_fails_its_subgraph_naming_it(server, users, tmp_path,  # noqa: F811
                                                                          monkeypatch):
    names, urls, _ = users
    other = names["w"].replace("prov", "prov4")
    honest = Workers(create_user(server.url, "worker", other), tmp_path)
    honest.start(1)     # verify=2: both users' workers read the constant, and would agree on a forged one
    monkeypatch.setenv("RAVOP_SAME_HOST", "off")   # workers read the chunks (no mapped file of the requester)
    attacker = redis.Redis.from_url(urls["w"])
    try:
        R.initialize(redis_url=urls["a"])
        for chunk, rewrite in ((2**22, "value"), (2**14, "chunk")):
            monkeypatch.setenv("RAVOP_CHUNK_BYTES", str(chunk))   # 64 KiB: one value, or in chunks (t:{node}:c)
            side = 128
            R.Graph(name=f"constant-{rewrite}", verify=2)
            x = R.t(torch.full((side, side), 2.0))
            (x @ x).persist_op("product")
            assert R.activate()["subgraphs"] == 1
            keys = require().keys()
            [node] = [int(n) for n in redis.Redis.from_url(urls["a"]).hkeys(keys.constants)]
            with pytest.raises(redis.exceptions.NoPermissionError):   # the seals are the requester's
                attacker.hset(keys.constants, node, "0" * 64)
            forged = torch.full((side, side), 3.0)
            if rewrite == "value":
                attacker.set(keys.tensor(node), encode_tensor(forged))   # granted: workers store outputs
            else:   # one chunk of it (HSET on a tensor's chunks is granted: checkpoints are written so)
                assert attacker.hlen(keys.tensor(node) + ":c") > 1
                attacker.hset(keys.tensor(node) + ":c", 0, forged.numpy().tobytes()[:16 * 1024])
            R.execute()
            with pytest.raises(GraphFailedError, match=rf"constant node {node} was changed after upload: its stored "
                                                      "value's digest .* is not .*, which the requester recorded"):
                R.track_progress(progress_bar=False, timeout=120)
        R.Graph(name="constant-untouched", verify=2)     # one nobody rewrote runs, each voter checking it
        x = R.t(torch.full((128, 128), 2.0))
        x.persist_op("x")
        (x @ x).persist_op("product")
        R.activate()
        R.execute()
        R.track_progress(progress_bar=False, timeout=120)
        assert torch.equal(R.fetch_persisting_op("product"), torch.full((128, 128), 4.0 * 128))
        keys = require().keys()     # a persisted constant rewritten after the graph: refused at fetch too
        node = int(redis.Redis.from_url(urls["a"]).hget(keys.persist, "x"))
        attacker.set(keys.tensor(node), encode_tensor(torch.full((128, 128), 3.0)))
        with pytest.raises(SealBroken, match=rf"'x' \(constant node {node} of graph {keys.graph_id}\) was changed "
                                             "after upload"):
            R.fetch_persisting_op("x")
    finally:
        attacker.close()
        honest.stop_all()
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("ACL", "DELUSER", other)
        admin.close()
