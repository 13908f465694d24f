"""A loop's GraphWatch (worker/loops/graph_watch.py) on a real server: it sees a cancel and a stop request by its own
looks, one thread of the process looks for all the loops it runs (none started per loop), a closed watch is looked
at no more, and a watch whose look fails for another reason than the server's leaves the others watched."""
import threading
import time
import uuid

import pytest

from ravop.store import GraphKeys
from worker.loops.graph_watch import GraphWatch

INTERVAL = 0.02


@pytest.fixture
def graph(client):
    keys = GraphKeys("watch", uuid.uuid4().hex[:12])
    client.hset(keys.meta, mapping={"state": "running"})
    yield keys
    client.delete(keys.meta)


def wait_for(condition, seconds=30):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def watch_threads():
    return [t for t in threading.enumerate() if t.name == "graph-watch"]


def test_a_watch_sees_a_stop_request_and_a_cancel_by_its_own_looks(client, graph):
    watch = GraphWatch(client, graph, INTERVAL)
    watch.start()
    try:
        assert watch.ended is None and not watch.stop_requested()
        client.hset(graph.meta, "stop", "enough")
        wait_for(watch.stop_requested)
        assert watch.stop_reason == "enough" and watch.ended is None
        client.hset(graph.meta, "state", "cancelled")
        wait_for(lambda: watch.ended is not None)
        assert watch.ended == b"cancelled"
    finally:
        watch.close()


def test_one_thread_looks_for_every_loop_and_a_closed_watch_is_left_alone(client, graph):
    for _ in range(20):   # loops run one after another, as a worker runs them
        watch = GraphWatch(client, graph, INTERVAL)
        watch.start()
        watch.close()
    assert len(watch_threads()) == 1
    looks = []
    closed = GraphWatch(client, graph, INTERVAL)
    closed.look = lambda: looks.append(1)
    closed.start({"state": b"running", "stop": None})
    try:
        wait_for(lambda: looks)
    finally:
        closed.close()
    seen = len(looks)
    time.sleep(10 * INTERVAL)
    assert len(looks) == seen


def test_a_watch_whose_look_breaks_leaves_the_others_watched(client, graph):
    broken = GraphWatch(client, graph, INTERVAL)
    broken.look = lambda: 1 / 0
    watch = GraphWatch(client, graph, INTERVAL)
    broken.start({"state": b"running", "stop": None})
    watch.start()
    try:
        client.hset(graph.meta, "state", "failed")
        wait_for(lambda: watch.ended is not None)
        assert watch.ended == b"failed" and broken.ended is None
    finally:
        broken.close()
        watch.close()
