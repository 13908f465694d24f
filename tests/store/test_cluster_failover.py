"""A Redis Cluster losing a primary mid-run. With replicas (6 nodes, one replica per primary, as
`redis-cli --cluster create --cluster-replicas 1` makes them) the replica takes over and the graph completes
with the same bits as without the failure; the failover time is measured and printed (pytest -s). Without
replicas the requester gets a clear error naming the lost node, and the workers stay up."""
import os
import time

import pytest
import torch

import ravop as R
from ravop.core.errors import ConnectionFailed
from ravop.local.local_cluster import LocalCluster

from conftest import Workers
from helpers import wait_for
from test_integration_cluster import chain

NODE_TIMEOUT_MS = 1000   # a dead node is marked failed after this (production servers: 15000, the default)


def run_chain(session, name, on_taken=None):
    """The value of a chain of many small subgraphs; `on_taken(keys)` is called once the first is being run."""
    R.Graph(name=name)
    chain(11, 384, 60).persist_op("x")
    R.activate(min_subgraph_seconds=0, max_subgraph_seconds=0)
    keys = session.keys()
    assert int(session.client.hget(keys.meta, "n_subgraphs")) >= 10
    R.execute()
    if on_taken is not None:
        wait_for(lambda: session.client.hget(keys.taken, 0), "the first subgraph taken")
        on_taken(keys)
    R.track_progress(progress_bar=False)
    return R.fetch_persisting_op("x")


@pytest.fixture
def cluster_of(tmp_path):
    """Start a LocalCluster(**options) with two workers on it; stopped afterwards."""
    made = []

    def make(**options):
        cluster = LocalCluster(3, node_timeout_ms=NODE_TIMEOUT_MS, **options)
        pool = Workers(cluster.urls[0], tmp_path)
        made.append((cluster, pool))
        pool.start(2)
        return cluster, pool, R.initialize(token=f"fo-{os.urandom(3).hex()}", redis_url=cluster.urls[1])
    yield make
    for cluster, pool in made:
        pool.stop_all()
        cluster.stop()


def test_a_primary_killed_mid_run_fails_over_and_the_graph_gives_the_same_bits(cluster_of, no_loop_folding):
    cluster, pool, session = cluster_of(replicas=1)
    assert len(cluster.ports) == 6
    expected = run_chain(session, "before")
    failover = {}

    def kill_the_graphs_primary(keys):
        primary = cluster.primary_of(keys.meta)
        cluster.processes[primary].kill()
        killed = time.monotonic()
        replacement = wait_for(lambda: _served_elsewhere(cluster, keys.meta, primary), "a replica to take over")
        failover.update(seconds=time.monotonic() - killed, node=cluster.ports[replacement])

    value = run_chain(session, "during a failover", kill_the_graphs_primary)
    print(f"\nfailover: the replica on port {failover['node']} served the graph's slot {failover['seconds']:.2f} s "
          f"after its primary was killed (cluster-node-timeout {NODE_TIMEOUT_MS} ms)")
    assert torch.equal(value, expected)
    assert all(pool.alive(name) for name in pool.procs), [pool.log(n) for n in pool.procs]


def _served_elsewhere(cluster, key, dead):
    try:
        serving = cluster.primary_of(key)
    except Exception:  # noqa: BLE001 - the cluster is between states: ask again
        return None
    return serving if serving != dead else None


def test_without_replicas_the_requester_is_told_which_node_was_lost_and_workers_stay_up(cluster_of,
                                                                                         no_loop_folding):
    cluster, pool, session = cluster_of()
    lost = {}

    def kill_the_graphs_primary(keys):
        lost["index"] = cluster.primary_of(keys.meta)
        cluster.processes[lost["index"]].kill()

    with pytest.raises(ConnectionFailed) as failed:
        run_chain(session, "on a lost node", kill_the_graphs_primary)
    port = cluster.ports[lost["index"]]
    message = str(failed.value)
    assert f"lost 127.0.0.1:{port} (slots " in message and "no replica took its place" in message, message
    time.sleep(3 * NODE_TIMEOUT_MS / 1000)   # the workers meet the lost node for a while: none exits
    assert all(pool.alive(name) for name in pool.procs), [pool.log(n) for n in pool.procs]
