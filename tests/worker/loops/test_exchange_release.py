"""Exchanged values leave the store once every loop that reads them has checkpointed past them
(worker/loops/exchange.py, ravop/client/exchange_readers.py): over many rounds of resident replicas on a real server the
number of exchange keys and their bytes stay flat, and the replicas still give the in-process bits."""
import pytest
import redis
import torch

from compiler.compile import compile_graph
import ravop as R
from ravop.client import session as sessions
from helpers import on_one_thread
from ravop.client.exchange_readers import exchange_readers
from ravop.runtime.evaluate import evaluate_persisted
from ravop.store import GraphKeys
from test_diloco import PARAM_NAMES
from test_parallel_math import X, Y, ravdl_net, torch_net
from test_security import users  # noqa: F401  (the fixture: token and worker ACL users, one worker running)
from worker.loops.exchange import _readers


def record(name, n_epochs, strategy):
    graph = R.Graph(name=name, seed=11)
    model = ravdl_net(torch_net())
    persisted = list(model.fit(X, Y, n_epochs=n_epochs, batch_size=6, shuffle=True, seed=3, strategy=strategy))
    model.persist_weights()
    return graph, persisted + PARAM_NAMES


def test_the_readers_of_each_channel_are_counted_from_the_plan():
    graph, _ = record("readers", 1, R.parallel.LocalSGD(3, 2, resident=True))
    readers = exchange_readers(compile_graph(graph).plan)
    # replica 0 reads every other replica's values; replicas 1 and 2 read the mean
    assert {c.split(".")[0] for c in readers} == {"avg", "mean"}
    assert all(n == 1 for c, n in readers.items() if c.startswith("avg.")) and \
        all(n == 2 for c, n in readers.items() if c.startswith("mean."))
    graph, _ = record("gossip readers", 1, R.parallel.Gossip(3, resident=True))
    assert set(exchange_readers(compile_graph(graph).plan).values()) == {2}   # all to all


@pytest.mark.parametrize("field", [None, b"", b"not json", b"[1, 2]", b'{"a": -1, "b": "2", "c": true}'])
def test_a_malformed_readers_field_deletes_nothing(field):
    assert _readers(field) == {}


def exchange_footprint(client, keys):
    found = list(client.scan_iter(match=keys.prefix + "x:*", count=1000))
    values = [key for key in found if not key.endswith(b":acks")]
    return len(values), sum(client.memory_usage(key) or 0 for key in values)


def test_store_memory_stays_flat_over_rounds(engine, workers, client):
    workers.start(2, extra=("--checkpoint-steps", "3"))
    footprints = []
    for n_epochs in (2, 12):   # 8 or 48 rounds of averaging (sync_every=1)
        strategy = R.parallel.LocalSGD(2, sync_every=1, resident=True)
        graph, persisted = record(f"flat {n_epochs}", n_epochs, strategy)
        R.activate()
        R.execute()
        R.track_progress(timeout=600, progress_bar=False)
        footprints.append(exchange_footprint(client, GraphKeys(engine.token, graph.id)))
        want = on_one_thread(evaluate_persisted, graph, persisted)
        for name in persisted:
            assert torch.equal(R.fetch_persisting_op(name), want[name]), name
    print(f"exchange keys and bytes left after 8 and 48 rounds: {footprints}")
    per_round = 4 + 4 + 1   # what one round writes: 4 values up (replica 1), 4 means down (4 parameters)
    assert footprints[1][0] <= footprints[0][0] + per_round   # flat: at most the rounds since the last checkpoints
    assert footprints[1][0] < 48 * 8 / 4


def test_a_worker_user_may_delete_the_exchanged_values_it_released(server, engine, users):
    """Under the server's ACL users (`ravop admin`): the workers' deletions of exchanged values are within their
    rules, and the replicas finish with the in-process bits. (`engine` puts the session back on the server's
    default user once `users` has removed the token user.)"""
    names, urls, pool = users
    [first] = pool.procs
    pool.terminate(first)   # idle: it checkpoints at its defaults; these every 3 steps
    pool.start(2, extra=("--checkpoint-steps", "3"))
    R.initialize(redis_url=urls["a"])
    graph, persisted = record("acl release", 6, R.parallel.LocalSGD(2, sync_every=1, resident=True))
    R.activate()
    R.execute()
    R.track_progress(timeout=600, progress_bar=False)
    want = on_one_thread(evaluate_persisted, graph, persisted)
    for name in persisted:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name
    for worker in set(pool.procs) - {first}:
        assert "NOPERM" not in pool.log(worker) and "Error" not in pool.log(worker), pool.log(worker)
    admin = redis.Redis.from_url(server.url)
    keys = GraphKeys(sessions.require().token, graph.id)
    assert exchange_footprint(admin, keys)[0] < 24 * 8 / 4   # released as they went (24 rounds of 8 values)
    admin.close()
