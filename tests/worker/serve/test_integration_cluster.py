"""Several worker processes on one real server: parallel branches, a worker SIGKILLed mid-subgraph, SIGTERM,
and results that do not depend on which or how many workers ran them."""
import time

import pytest
import torch

import ravop as R
from ravop.runtime.evaluate import evaluate

from helpers import on_one_thread

# The failover tests build chains of identical steps to get many subgraphs; folded into one loop they would
# test the loop's checkpoints instead (tests/worker/loops/test_loop_workers.py does that).
pytestmark = pytest.mark.usefixtures("no_loop_folding")

ONE_SUBGRAPH = {"min_subgraph_seconds": 1e6, "max_subgraph_seconds": 1e6}  # compile a chain as one subgraph


def chain(seed, n, steps):
    """`steps` dependent matmuls on random n x n constants (too big for the compiler to fold)."""
    g = torch.Generator().manual_seed(seed)
    a = R.t(torch.rand(n, n, generator=g))
    b = R.t(torch.rand(n, n, generator=g) / n)
    x = a
    for _ in range(steps):
        x = R.matmul(x, b) + a
    return x


def evaluate_on_one_thread(op):
    """The in-process reference, on one thread as the workers run (more threads than cores is slow)."""
    return on_one_thread(evaluate, op)


def ran_by(client, session):
    keys = session.keys()
    return {int(k): v.decode() for k, v in client.hgetall(keys.ran).items()}


def wait_until_taken(client, session, subgraph_id=0, timeout=120):
    keys = session.keys()
    deadline = time.monotonic() + timeout
    while (taken := client.hget(keys.taken, subgraph_id)) is None:
        assert time.monotonic() < deadline, "no worker took the subgraph"
        time.sleep(0.01)
    return taken.decode()


def test_independent_branches_run_on_two_workers(engine, workers, client):
    names = set(workers.start(2))
    R.Graph(name="branches")
    chain(1, 512, 40).persist_op("x")
    chain(2, 512, 40).persist_op("y")
    summary = R.activate()
    assert summary["max_parallel_width"] >= 2
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    assert set(ran_by(client, engine).values()) == names


def test_sigkill_mid_subgraph_completes_on_another_worker(engine, workers, client):
    [first] = workers.start(1, reclaim_idle=1.0)
    R.Graph(name="killed")
    x = chain(3, 512, 600)  # about 3 s of matmuls on one core
    x.persist_op("x")
    assert R.activate(**ONE_SUBGRAPH)["subgraphs"] == 1
    R.execute()
    assert wait_until_taken(client, engine) == first
    time.sleep(0.5)  # well into the subgraph
    workers.kill(first)
    assert client.hget(engine.keys().meta, "state") == b"running"
    [second] = workers.start(1, reclaim_idle=1.0)
    R.track_progress(progress_bar=False, timeout=300)
    assert ran_by(client, engine) == {0: second}
    torch.testing.assert_close(R.fetch_persisting_op("x"), evaluate_on_one_thread(x), rtol=1e-5, atol=0)


RECLAIM_IDLE = 120.0


def test_a_sigkilled_worker_stalls_its_graph_for_seconds_not_half_a_minute(engine, workers, client):
    # Default liveness settings (--dead-after 3): the idle worker sees the dead one's heartbeat key expire,
    # seconds after the kill on a quiet machine. Reclaiming idle work would wait RECLAIM_IDLE: taking over
    # well before that shows the liveness path did it, without a wall-clock bound that load can break.
    first, second = workers.start(2, reclaim_idle=RECLAIM_IDLE)
    R.Graph(name="failover")
    x = chain(7, 512, 600)
    x.persist_op("x")
    assert R.activate(**ONE_SUBGRAPH)["subgraphs"] == 1
    R.execute()
    victim = wait_until_taken(client, engine)
    survivor = second if victim == first else first
    time.sleep(0.5)
    workers.kill(victim)
    killed = time.monotonic()
    keys = engine.keys()
    while client.hget(keys.taken, 0) != survivor.encode():
        assert time.monotonic() - killed < RECLAIM_IDLE, "the dead worker's subgraph was not taken over"
        time.sleep(0.01)
    stall = time.monotonic() - killed
    assert stall < RECLAIM_IDLE / 2, f"taken over {stall:.1f} s after the kill: by the idle reclaim?"
    R.track_progress(progress_bar=False, timeout=300)
    assert ran_by(client, engine) == {0: survivor}
    torch.testing.assert_close(R.fetch_persisting_op("x"), evaluate_on_one_thread(x), rtol=1e-5, atol=0)


def test_a_slow_worker_is_not_robbed(engine, workers, client):
    # A subgraph several times longer than --dead-after (the last assert checks that it was, ~1.5 s a
    # thousand steps here): the heartbeat keeps its worker alive.
    first, second = workers.start(2, extra=("--dead-after", "0.6"))
    R.Graph(name="slow")
    chain(8, 512, 2000).persist_op("x")
    R.activate(**ONE_SUBGRAPH)
    R.execute()
    runner = wait_until_taken(client, engine)
    R.track_progress(progress_bar=False, timeout=300)
    keys = engine.keys()
    assert ran_by(client, engine) == {0: runner} and client.hget(keys.taken, 0) == runner.encode()
    assert float(client.hget(keys.meta, "finished")) - float(client.hget(keys.meta, "started")) > 1.8


def test_sigterm_lets_the_running_subgraph_finish(engine, workers, client):
    [name] = workers.start(1)
    R.Graph(name="terminated")
    chain(4, 512, 400).persist_op("x")
    R.activate(**ONE_SUBGRAPH)
    R.execute()
    wait_until_taken(client, engine)
    assert workers.terminate(name) == 0
    assert client.hget(engine.keys().meta, "state") == b"done"
    assert ran_by(client, engine) == {0: name}
    assert not client.exists(f"ravop:_:worker:{name}")  # it unregistered


def run_random_graph():
    """A seeded graph with random ops and independent branches; returns its two outputs."""
    R.Graph(name="determinism", seed=7)
    noise = R.random_uniform(-1.0, 1.0, size=(256, 256))
    a = chain(5, 256, 10) + noise
    b = chain(6, 256, 10) * R.random(size=(256, 256))
    (a @ b).persist_op("out")
    R.random(size=(3,)).persist_op("draw")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    return R.fetch_persisting_op("out"), R.fetch_persisting_op("draw")


def test_same_results_with_one_or_two_workers(engine, workers):
    workers.start(1)
    one = run_random_graph()
    workers.start(1)   # a second worker: the branches now run in parallel
    two = run_random_graph()
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_a_value_read_from_the_cache_equals_one_read_from_redis(engine, workers):
    """A transpose is a strided view, and summing a view rounds differently from summing a contiguous copy.
    Redis always hands out contiguous tensors, so the cache must too, or a result would depend on whether
    the worker that ran the previous subgraph also runs the next."""
    def run():
        R.Graph(name="layout", seed=1)
        x = R.t(torch.randn(1000, 1000, generator=torch.Generator().manual_seed(0)))
        x.transpose().sum(axis=1).persist_op("row_sums")
        assert R.activate(min_subgraph_seconds=0, max_subgraph_seconds=0)["subgraphs"] == 2
        R.execute()
        R.track_progress(progress_bar=False, timeout=120)
        return R.fetch_persisting_op("row_sums")

    [cached] = workers.start(1)                      # runs both subgraphs: the transpose comes from its cache
    from_cache = run()
    workers.terminate(cached)
    workers.start(1, extra=["--cache-mib", "0"])     # no cache: the transpose comes back from Redis
    assert torch.equal(run(), from_cache)
