"""What a worker user may no longer decide for a token (issue 44), on a real server with `ravop admin` users and
real worker processes: it may not ban a token's workers (a raw SADD is refused; a token's bans are its requester's,
on the votes' evidence), a graph stopped by bans says who is banned and why instead of timing out silently, and a
start it drops from a token's inbox is posted again by the requester, which names the attack if it keeps
happening."""
import threading
import time

import pytest
import redis
import torch

import ravop as R
from ravop.core.errors import GraphStateError
from ravop.store import TokenKeys

from test_security import run_graph, users  # noqa: F401  (users: the fixture of two token users and a worker user)


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
