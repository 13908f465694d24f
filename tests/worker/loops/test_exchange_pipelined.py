"""A resident replica's exchange over a slow link waits on no round trip it can avoid (worker/loops/exchange.py): sends
are written in order by a thread beside the loop, a checkpoint waits for them first, a receive reads only the
values still missing, the next run of a template's channels is fetched in the background as soon as it is
there, and the checks a waiting loop makes (the graph's state, whether to give the loop up) are read beside it.
On a real server."""
import threading
import time
import uuid

import pytest
import redis
import torch

from ravop.core.graph_states import RUNNING
from ravop.store import GraphKeys
from ravop.wire import encode_tensor
from worker.loops import exchange as exchange_module
from worker.loops.exchange import StoreExchange
from worker.loops.loop_subgraph import _Writer


def exchange(client, keys, attention=None):
    def on_wait(state):
        if state != RUNNING.encode():
            raise RuntimeError(f"the graph stopped: {state}")
    return StoreExchange(client, keys, "cpu", on_wait, attention)


@pytest.fixture
def keys(client):
    keys = GraphKeys(f"t{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:12])
    client.hset(keys.meta, "state", RUNNING)
    yield keys
    client.delete(*client.keys(keys.prefix + "*"))


def test_sends_land_in_order_and_flush_waits_for_them(client, keys):
    sender = exchange(client, keys)
    values = [torch.full((1000,), float(k)) for k in range(5)]
    for run, value in enumerate(values):
        sender.send(["up.1.0"], run, [value])
    value = values[-1]
    value += 1   # the loop may update a sent tensor in place: what was sent is what it held then
    sender.flush()
    for run in range(5):
        assert client.get(keys.exchange("up.1.0", run)) == encode_tensor(torch.full((1000,), float(run)))
    sender.close()


def test_a_failed_background_send_is_raised_in_the_loop(client, keys):
    sender = exchange(client, keys)
    sender.client = redis.Redis(port=1, socket_connect_timeout=0.5)   # nothing listens there
    sender.send(["up.1.0"], 0, [torch.ones(3)])
    with pytest.raises(redis.ConnectionError):
        sender.flush()
    sender.close()


def test_the_next_run_is_fetched_in_the_background_and_received_once(client, keys):
    sender, receiver = exchange(client, keys), exchange(client, keys)
    channels = ["down.0", "down.1"]
    sender.send(channels, 0, [torch.zeros(4), torch.ones(2)])
    sender.flush()
    first = receiver.receive(channels, 0)
    assert [t.tolist() for t in first] == [[0.0] * 4, [1.0] * 2]
    ahead = receiver.prefetched[(tuple(channels), 1)]
    assert not ahead.done.is_set()
    sender.send(channels[:1], 1, [torch.full((4,), 2.0)])   # one of the two: the fetch goes on for the other
    sender.flush()
    deadline = time.monotonic() + 30
    while ahead.found[0] is None:
        assert time.monotonic() < deadline, "the background fetch never read the value that was there"
        time.sleep(0.01)
    assert not ahead.done.is_set()
    sender.send(channels[1:], 1, [torch.full((2,), 3.0)])
    sender.flush()
    second = receiver.receive(channels, 1)   # whatever the fetch had, all of it, once
    assert [t.tolist() for t in second] == [[2.0] * 4, [3.0] * 2]
    assert receiver.received_bytes == sum(len(client.get(keys.exchange(c, r))) for c in channels for r in (0, 1))
    assert [key for key, _ in receiver.read_keys] == [keys.exchange(c, r) for r in (0, 1) for c in channels]
    next_run = receiver.prefetched[(tuple(channels), 2)]
    receiver.close()   # the fetch of a run that never comes stops with the loop
    sender.close()
    assert next_run.stopped.is_set() and not next_run.done.is_set()


def test_a_receive_stops_waiting_when_the_graph_stops(client, keys):
    receiver = exchange(client, keys)
    client.hset(keys.meta, "state", "FAILED")
    with pytest.raises(RuntimeError, match="stopped"):
        receiver.receive(["down.0"], 0)
    receiver.close()


def test_a_receive_returns_once_its_values_are_here_not_after_the_check_under_way_beside_it(client, keys,
                                                                                            monkeypatch):
    monkeypatch.setattr(exchange_module, "STATE_SECONDS", 0)   # a check starts as soon as the receive waits
    asked, release, answered = threading.Event(), threading.Event(), []

    def attention():   # the work stream's and liveness reads: round trips, here held until the test says
        asked.set()
        answered.append(release.wait(60))
        return False
    sender, receiver = exchange(client, keys), exchange(client, keys, attention)

    def send_once_asked():
        if asked.wait(60):
            sender.send(["down.0"], 0, [torch.full((3,), 5.0)])
            sender.flush()
    posting = threading.Thread(target=send_once_asked)
    posting.start()
    try:
        value, = receiver.receive(["down.0"], 0)
        assert asked.is_set(), "the receive never checked whether to give the loop up while it waited"
        assert answered == [], "the receive waited for the check beside it although its value was there"
        assert value.tolist() == [5.0] * 3
    finally:
        release.set()
        posting.join()
        receiver.close()
        sender.close()


def test_a_waiting_loop_acts_in_its_own_thread_when_the_check_says_it_must(client, keys, monkeypatch):
    monkeypatch.setattr(exchange_module, "STATE_SECONDS", 0)
    threads = []

    def on_wait(state):
        threads.append(threading.current_thread())
        raise RuntimeError("handed back")
    receiver = StoreExchange(client, keys, "cpu", on_wait, attention=lambda: True)
    with pytest.raises(RuntimeError, match="handed back"):
        receiver.receive(["down.0"], 0)   # nothing is ever sent: only the check ends the wait
    assert threads == [threading.main_thread()]
    receiver.close()


def test_a_checkpoint_waits_for_the_sends_before_it_is_published(client, keys):
    writer = _Writer(client, keys, "7", [[]], checkpoint_steps=1, checkpoint_seconds=1e9, n_steps=10)
    published_at_flush = []

    class Exchange:
        def flush(self):
            published_at_flush.append(client.exists(keys.checkpoint("7")))

        def take_reads(self):
            return []

        def release(self, reads):
            pass
    writer.exchange = Exchange()
    writer.write(3)   # a flush of losses and progress: no checkpoint, no wait
    assert published_at_flush == []
    writer.write(4, [torch.ones(2)])
    assert published_at_flush == [0] and client.hget(keys.checkpoint("7"), "step") == b"4"
    writer.close()
