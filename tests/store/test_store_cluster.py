"""The engine on a real Redis/Valkey Cluster: three server processes in cluster mode, made here from the
binary the embedded default uses (ravop.local.local_cluster). The same code as on one server, with the key schema
keeping each graph in one hash slot and the outbox hand-off carrying ready subgraphs to the work streams."""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
from redis.cluster import RedisCluster
from redis.crc import key_slot

import ravop as R
from ravop.tools import admin
from conftest import Workers
from helpers import on_one_thread, wait_for
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.local.local_cluster import LocalCluster
from ravop.runtime.evaluate import evaluate, evaluate_persisted
from ravop.store import GraphKeys, connect
from ravop.store import graphs as store_graphs
from ravop.store.handoff import Handoff
from ravop.store.keys import FederatedKeys
from ravop.store.keys import DEAD_LETTER, STARTING, TokenKeys, queue
from ravop.store.scripts import Scripts
from ravop.store.tensors import chunks_key
from test_integration_cluster import chain
from worker.loops.loop_subgraph import checkpoint_tensor_key
from worker.serve.consumer import Worker

ROOT = Path(__file__).resolve().parents[2]


def graph_keys_of(keys):
    """Every key of one graph the schema names (a tensor, its chunks, a checkpoint and its tensors, votes)."""
    named = [getattr(keys, slot) for slot in GraphKeys.__slots__ if slot not in ("token", "graph_id")]
    fed = FederatedKeys(keys)
    return named + [keys.tensor(7), chunks_key(keys.tensor(7)), keys.checkpoint(3), keys.votes(3), keys.vote(3, "0-5:w", "w"),
                    checkpoint_tensor_key(keys, 3, 100, 0), chunks_key(checkpoint_tensor_key(keys, 3, 100, 0)),
                    fed.stats, fed.clients, fed.partials]


def test_every_key_of_a_graph_is_in_one_slot_and_graphs_spread_over_the_slots():
    keys = GraphKeys("team-a", "g1")
    assert {key_slot(k.encode()) for k in graph_keys_of(keys)} == {key_slot(keys.meta.encode())}
    slots = {key_slot(GraphKeys(token, f"g{i}").meta.encode()) for token in ("a", "b") for i in range(50)}
    thirds = {slot * 3 // 16384 for slot in slots}
    assert len(slots) > 90 and thirds == {0, 1, 2}   # 100 graphs: nearly 100 slots, on all three shards
    # Dead-lettering a message acks it in the same script: the work streams and the dead letters share a slot.
    assert len({key_slot(k.encode()) for k in (queue("cpu"), queue("cuda"), DEAD_LETTER)}) == 1


def test_a_graph_id_with_dots_cannot_reach_another_tokens_keys():
    # The tag "{a.b.c}" is shared by token a's graph b.c and token a.b's graph c: the same slot, other keys.
    assert GraphKeys("a", "b.c").meta != GraphKeys("a.b", "c").meta
    assert GraphKeys("a", "b.c").meta.startswith(TokenKeys("a").pattern[:-1])


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(3) as local:
        yield local


@pytest.fixture(scope="module")
def cluster_workers(cluster, tmp_path_factory):
    pool = Workers(cluster.urls[0], tmp_path_factory.mktemp("cluster-workers"))
    yield pool
    pool.stop_all()


@pytest.fixture
def requester(cluster):
    session = R.initialize(token=f"cl-{os.urandom(4).hex()}", redis_url=cluster.urls[1])
    yield session
    R.initialize(token=session.token, redis_url=cluster.urls[1])
    R.flush()


def test_any_node_url_gives_a_cluster_client_and_a_standalone_url_a_plain_one(cluster, server):
    for url in cluster.urls:
        client = connect(url)
        assert isinstance(client, RedisCluster)
        client.close()
    plain = connect(server.url)
    assert type(plain) is redis.Redis
    plain.close()


REQUESTER = textwrap.dedent("""
    import sys, torch
    import ravop as R
    from ravop.runtime.evaluate import evaluate
    url, token, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    R.initialize(token=token, redis_url=url)
    g = torch.Generator().manual_seed(seed)
    for i in range(4):   # four graphs in a row, each of several subgraphs
        R.Graph(name=f"g{i}")
        a, b = R.t(torch.rand(64, 64, generator=g)), R.t(torch.rand(64, 64, generator=g))
        x = R.relu(R.matmul(a, b) - float(i)) * 0.5
        y = R.softmax(R.matmul(x, a), axis=1).persist_op("y")
        z = (R.sum(x) + R.mean(y)).persist_op("z")
        R.activate()
        R.execute()
        R.track_progress(progress_bar=False, timeout=300)
        for name, op in (("y", y), ("z", z)):
            assert torch.equal(R.fetch_persisting_op(name), evaluate([op])[0]), (token, i, name)
    R.flush()
    print("exact", token)
""")


def test_requesters_on_different_nodes_at_once_get_exact_results(cluster, cluster_workers):
    cluster_workers.start(2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", REQUESTER, url, f"req{i}-{os.urandom(3).hex()}", str(i)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, url in enumerate(cluster.urls)]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0 and "exact" in output, output[-3000:]


def test_the_graphs_of_many_requesters_land_on_every_shard(cluster, requester):
    client = requester.client
    # Graph ids are random and a graph's keys share its id's hash slot: with 12 graphs one of 3 shards got none
    # about 2% of the time; with 40 that is about 3 in 10 million.
    for i in range(40):
        R.Graph(name=f"spread{i}")
        R.t(torch.ones(2)).persist_op("x")
        R.activate()
    counts = [redis.Redis.from_url(url).dbsize() for url in cluster.urls]
    assert all(count > 0 for count in counts), counts
    assert len(store_graphs.list_graphs(client, requester.token)) == 40


def only(pool, count, **options):
    """Stop the module's running workers and start `count` new ones: the test knows who serves."""
    for name in [n for n in pool.procs if pool.alive(n)]:
        pool.terminate(name)
    return pool.start(count, **options)


def test_a_worker_sigkilled_mid_subgraph_leaves_exact_results(cluster, cluster_workers, requester,
                                                              no_loop_folding):
    [first] = only(cluster_workers, 1, reclaim_idle=1.0)
    client = requester.client
    R.Graph(name="killed")
    x = chain(3, 512, 600).persist_op("x")   # about 3 s of matmuls on one core
    R.activate(min_subgraph_seconds=1e6, max_subgraph_seconds=1e6)
    R.execute()
    keys = requester.keys()
    wait_for(lambda: client.hget(keys.taken, 0), "the subgraph taken")
    time.sleep(0.5)
    cluster_workers.kill(first)
    assert client.hget(keys.meta, "state") == b"running", client.hget(keys.meta, "error")
    [second] = cluster_workers.start(1, reclaim_idle=1.0)
    R.track_progress(progress_bar=False, timeout=300)
    assert client.hget(keys.ran, 0).decode() == second
    torch.testing.assert_close(R.fetch_persisting_op("x"), on_one_thread(evaluate, x), rtol=1e-5, atol=0)


class Crash(BaseException):
    """A worker dying at a chosen point (not an Exception: the worker would report it as a failure)."""


def test_a_worker_dying_between_completing_and_delivering_loses_nothing(cluster, cluster_workers, requester,
                                                                       no_loop_folding):
    client = requester.client
    for name in [n for n in cluster_workers.procs if cluster_workers.alive(n)]:
        cluster_workers.terminate(name)
    R.Graph(name="several steps")
    c = chain(5, 128, 20).persist_op("c")
    R.activate(min_subgraph_seconds=0, max_subgraph_seconds=0)
    keys = requester.keys()
    assert int(client.hget(keys.meta, "n_subgraphs")) >= 2
    R.execute()
    ghost = Worker(connect(cluster.urls[2]), "ghost")   # in this process, to stop it where a crash would

    def crash(*args):
        raise Crash()
    ghost.handoff.completed = crash
    with pytest.raises(Crash):
        ghost._handle(*wait_for(ghost._next, "the first subgraph's message"))
    assert client.hlen(keys.outbox) >= 1 and client.hget(keys.meta, "state") == b"running"
    cluster_workers.start(1, reclaim_idle=1.0)   # takes the ghost's message over, drains the outbox
    R.track_progress(progress_bar=False, timeout=120)
    torch.testing.assert_close(R.fetch_persisting_op("c"), on_one_thread(evaluate, c), rtol=1e-5, atol=0)
    assert client.hlen(keys.outbox) == 0


def test_a_requester_dying_while_starting_leaves_its_graph_to_the_workers(cluster, cluster_workers, requester,
                                                                         no_loop_folding):
    client = requester.client
    scripts = Scripts(client)
    R.Graph(name="started by a requester that died")
    b = chain(6, 256, 10).persist_op("b")
    R.activate(min_subgraph_seconds=0, max_subgraph_seconds=0)
    keys = requester.keys()
    ref = f"{keys.token}/{keys.graph_id}"
    # What Handoff.start leaves if the requester dies after START: the mark, and the roots in the outbox.
    client.zadd(STARTING, {ref: time.time() - 60})
    started, handed = scripts.start(keys)
    assert started == 1 and handed and client.hlen(keys.outbox) == len(handed)
    only(cluster_workers, 1)   # its takeover look reclaims the stale start
    R.track_progress(progress_bar=False, timeout=120)
    torch.testing.assert_close(R.fetch_persisting_op("b"), on_one_thread(evaluate, b), rtol=1e-5, atol=0)
    assert client.hlen(keys.outbox) == 0 and client.zscore(STARTING, ref) is None
    assert Handoff(client, scripts).reclaim_starts() == 0


def test_outbox_entries_no_script_wrote_are_dropped_by_a_drain(cluster, requester):
    client = requester.client
    keys = GraphKeys(requester.token, "forged")
    client.hset(keys.outbox, mapping={"1": "gpu", "x": "cpu", "2": b"\xff", "-": "cpu;1"})
    before = client.xlen(queue("cpu"))
    Handoff(client, Scripts(client)).drain(keys)
    assert client.hlen(keys.outbox) == 0 and client.xlen(queue("cpu")) == before


def test_a_token_user_made_by_ravop_admin_works_on_every_shard_and_only_for_its_keys(cluster):
    admin_client = connect(cluster.urls[0])
    name = f"user-{os.urandom(3).hex()}"
    url, _ = admin.create(admin_client, cluster.urls[0], "token", name)
    try:
        for node_url in cluster.urls:
            assert redis.Redis.from_url(node_url).acl_getuser(name) is not None
        user = connect(url.replace(f":{cluster.ports[0]}/", f":{cluster.ports[2]}/"))   # another node's URL
        written = {GraphKeys(name, f"g{i}").meta for i in range(30)}
        for key in written:   # 30 graphs: on every shard
            user.hset(key, "state", "activated")
        assert len({admin_client.get_node_from_key(key).name for key in written}) == 3
        with pytest.raises(redis.exceptions.NoPermissionError):
            user.hset(GraphKeys("someone-else", "g1").meta, "state", "done")
        user.delete(*written)
    finally:
        admin.revoke(admin_client, "token", name)
    assert all(redis.Redis.from_url(node_url).acl_getuser(name) is None for node_url in cluster.urls)


def test_a_token_user_s_graph_runs_on_a_worker_user_through_its_inbox(cluster, tmp_path):
    """On a cluster too, a token user's start goes through its inbox (it may not write the streams or the
    starting marks), and a worker user starts and runs the graph (ravop.store.inbox)."""
    admin_client = connect(cluster.urls[0])
    suffix = os.urandom(3).hex()
    token_url, _ = admin.create(admin_client, cluster.urls[0], "token", f"tok-{suffix}")
    worker_url, _ = admin.create(admin_client, cluster.urls[0], "worker", f"wk-{suffix}")
    pool = Workers(worker_url, tmp_path)
    try:
        pool.start(1)
        session = R.initialize(redis_url=token_url.replace(f":{cluster.ports[0]}/", f":{cluster.ports[1]}/"))
        x = R.t(torch.arange(128 * 128, dtype=torch.float32).reshape(128, 128) / 16384)
        y = R.softmax(R.matmul(x, x), axis=1).persist_op("y")
        assert R.activate()["subgraphs"] >= 1   # run by a worker, not folded at activate
        R.execute()
        assert session.handoff.confined
        R.track_progress(progress_bar=False, timeout=300)
        assert torch.equal(R.fetch_persisting_op("y"), evaluate([y])[0])
        with pytest.raises(redis.exceptions.NoPermissionError):
            session.client.zadd(STARTING, {"x/y": 0})
        R.flush()
        [name] = pool.procs
        assert pool.alive(name)
    finally:
        pool.stop_all()
        admin.revoke(admin_client, "token", f"tok-{suffix}")
        admin.revoke(admin_client, "worker", f"wk-{suffix}")


def record_fit(name, epochs):
    graph = R.Graph(name=name, seed=4)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(32, 4)), np.eye(3)[rng.integers(0, 3, 32)]
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    for layer in (Dense(64, input_shape=(4,)), Activation("relu"), Dense(3)):
        model.add(layer)
    names = list(model.fit(x, y, n_epochs=epochs, batch_size=8, shuffle=True))
    model.predict(x).persist_op("prediction")
    return graph, names + ["prediction"]


def test_training_with_loop_templates_survives_a_kill_with_the_same_bits(cluster, cluster_workers, requester,
                                                                          monkeypatch):
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", "1024")   # checkpoints in chunks (the workers inherit it)
    names = only(cluster_workers, 2, reclaim_idle=1.0, extra=("--checkpoint-steps", "20"))
    client = requester.client
    graph, persisted = record_fit("fit on a cluster", epochs=600)
    R.activate()
    R.execute()
    keys = GraphKeys(requester.token, graph.id)
    [(loop_id, holder)] = wait_for(lambda: [(int(k), v.decode()) for k, v in client.hgetall(keys.taken).items()
                                            if client.exists(keys.checkpoint(int(k)))], "a checkpoint")
    cluster_workers.kill(holder)
    assert store_graphs.steps_done(client, keys) < 600 * 4, "the loop ended before the kill: make it longer"
    R.track_progress(timeout=300, progress_bar=False)
    assert client.hget(keys.ran, loop_id).decode() == next(n for n in names if n != holder)
    want = on_one_thread(evaluate_persisted, graph, persisted)
    for name in persisted:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name
    assert not client.exists(keys.checkpoint(loop_id))


def test_a_big_constant_sent_after_the_start_reaches_a_remote_style_worker_exactly(cluster, cluster_workers, requester,
                                                                                 monkeypatch):
    """ravop.store.background_upload on a cluster: its transactions (WATCH on the marker) in the graph's slot; the
    worker, which may not map the requester's file, waits for the held upload and reads every chunk."""
    import threading
    from ravop.store import background_upload
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", str(2**20))
    monkeypatch.setenv("RAVOP_SAME_HOST", "off")
    [name] = only(cluster_workers, 1, extra=("--verbose",))
    monkeypatch.delenv("RAVOP_SAME_HOST")
    go = threading.Event()
    monkeypatch.setattr(background_upload, "held_before_sending", lambda key: go.wait())
    try:
        X = np.random.default_rng(0).random((2048, 1024), dtype=np.float32)
        R.Graph(name="big constant")
        (R.t(X) * 2).persist_op("y")
        R.activate()
        R.execute()
        wait_for(lambda: "still uploading" in cluster_workers.log(name), "the worker to wait for the upload")
        go.set()
        R.track_progress(progress_bar=False, timeout=300)
        assert torch.equal(R.fetch_persisting_op("y"), torch.from_numpy(X) * 2)
    finally:
        go.set()
        background_upload.finish(requester.token)
