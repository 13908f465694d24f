"""A loop's flushes and checkpoints are written beside it (worker/loops/background_writes.py,
worker/loops/loop_subgraph.py): the loop goes on while a checkpoint waits for the exchange's sends and uploads, the
writes land in the order they were made, a checkpoint holds the carried values as they were when it was taken, and
after a failed write none lands and the loop stops at its next step. On a real server."""
import threading

import pytest
import torch

from helpers import wait_for
from ravop.core.graph_states import FAILED
from ravop.store import tensors as stored
from ravop.wire import decode_tensor, encode_tensor
from worker.loops.background_writes import BackgroundWrites
from worker.loops.loop_subgraph import LoopAbandoned, _Writer
from worker.loops.shared_checkpoint import decode as decode_shared, digest, value_key
from worker.serve.worker_metrics import WorkerMetrics

from test_exchange_pipelined import keys  # noqa: F401  (the fixture: a running graph's keys, deleted after)


class HeldExchange:
    """An exchange whose sends are in the store only once `sent` is set; records what each checkpoint released."""

    def __init__(self):
        self.sent, self.flushing = threading.Event(), threading.Event()
        self.read_keys, self.released = [], []
        self.fail = None

    def flush(self):
        self.flushing.set()
        self.sent.wait()
        if self.fail is not None:
            raise self.fail

    def take_reads(self):
        reads, self.read_keys = self.read_keys, []
        return reads

    def release(self, reads):
        self.released.append(reads)


def writer_for(client, keys, **kwargs):
    # one output per step (tensor id 100 + run), a checkpoint every 2 steps
    return _Writer(client, keys, "7", [[100]], checkpoint_steps=2, checkpoint_seconds=1e9, n_steps=10, **kwargs)


def test_the_loop_goes_on_while_a_checkpoint_waits_and_it_holds_the_values_of_its_step(client, keys):
    writer, exchange = writer_for(client, keys), HeldExchange()
    writer.exchange = exchange
    carried = torch.zeros(3)
    exchange.read_keys = [("x:0", "down.0")]
    writer.on_step(1, 0, 0, [torch.tensor(1.0)], [carried])
    writer.on_step(2, 0, 1, [torch.tensor(2.0)], [carried])   # a checkpoint at step 2, held at the exchange's flush
    assert exchange.flushing.wait(30)
    exchange.read_keys = [("x:1", "down.0")]   # read after the checkpoint was taken: not released by it
    carried += 5   # the loop updates its carried values in place: the checkpoint keeps step 2's
    writer.on_step(3, 0, 2, [torch.tensor(3.0)], [carried])   # returns although the checkpoint is not written
    assert not client.exists(keys.checkpoint("7"))
    exchange.sent.set()
    writer.writes.drain()
    assert client.hget(keys.checkpoint("7"), "step") == b"2"
    # a loop that exchanges values stores them by digest (worker/loops/shared_checkpoint.py)
    (name,) = decode_shared(client.hget(keys.checkpoint("7"), "shared"), 1).values()
    assert name == digest(torch.zeros(3)) and torch.equal(stored.read(client, value_key(keys, name)), torch.zeros(3))
    assert client.exists(keys.tensor(100), keys.tensor(101)) == 2
    assert exchange.released == [[("x:0", "down.0")]]
    writer.write(4, [carried])   # the loop's last write waits for the ones before it
    assert client.hget(keys.checkpoint("7"), "step") == b"4"
    assert client.hget(keys.steps, "7") == b"4" and client.exists(keys.tensor(102))
    assert not client.exists(value_key(keys, name))   # the previous checkpoint's values are deleted
    writer.close()


def test_a_checkpoint_due_while_the_last_is_in_flight_waits_for_it_and_takes_the_latest_state(client, keys):
    # worker/loops/checkpoint_cadence.py: one checkpoint in flight, copied into one host buffer, never a queue
    writer, exchange = writer_for(client, keys), HeldExchange()
    writer.exchange = exchange
    carried = torch.zeros(3)
    writer.on_step(1, 0, 0, [torch.tensor(1.0)], [carried])
    writer.on_step(2, 0, 1, [torch.tensor(2.0)], [carried])   # checkpoint 2, held in flight at the exchange's flush
    assert exchange.flushing.wait(30)
    (held,) = writer.buffer.held
    for step in range(3, 7):   # checkpoints asked at 4 and 6 while 2 is in flight: none taken, no copy made
        carried += 1
        writer.on_step(step, 0, step - 1, [torch.tensor(float(step))], [carried])
    assert writer.taken == 2 and torch.equal(held, torch.zeros(3))
    exchange.sent.set()
    wait_for(lambda: client.hget(keys.checkpoint("7"), "step") == b"2", "checkpoint 2")
    wait_for(lambda: not writer.timing.writing, "checkpoint 2's write to end")
    carried += 1
    writer.on_step(7, 0, 6, [torch.tensor(7.0)], [carried])   # the one due meanwhile: step 7's state, same buffer
    writer.writes.drain()
    assert client.hget(keys.checkpoint("7"), "step") == b"7" and writer.buffer.held[0] is held
    (name,) = decode_shared(client.hget(keys.checkpoint("7"), "shared"), 1).values()
    assert torch.equal(stored.read(client, value_key(keys, name)), torch.full((3,), 5.0))
    writer.close()


def test_after_a_failed_write_nothing_later_lands_and_the_loop_stops(client, keys):
    writer, exchange = writer_for(client, keys), HeldExchange()
    writer.exchange = exchange
    exchange.fail = ConnectionError("the store went away")
    writer.on_step(1, 0, 0, [torch.tensor(1.0)], [torch.zeros(1)])
    writer.on_step(2, 0, 1, [torch.tensor(2.0)], [torch.zeros(1)])   # its checkpoint fails at the flush
    assert exchange.flushing.wait(30)
    writer.write(3, wait=False)   # queued behind the failing checkpoint: dropped
    exchange.sent.set()
    with pytest.raises(ConnectionError, match="went away"):
        writer.writes.drain()
    writer.close()
    assert not client.exists(keys.checkpoint("7"), keys.tensor(100), keys.tensor(101))
    assert client.hget(keys.steps, "7") is None


def test_a_graph_that_stopped_stops_the_loop_at_its_next_step(client, keys):
    writer = writer_for(client, keys)
    client.hset(keys.meta, "state", FAILED)
    writer.on_step(1, 0, 0, [torch.tensor(1.0)], [torch.zeros(1)])
    writer.on_step(2, 0, 1, [torch.tensor(2.0)], [torch.zeros(1)])   # a checkpoint: finds the graph failed
    with pytest.raises(LoopAbandoned):
        writer.writes.drain()
        writer.on_step(3, 0, 2, [torch.tensor(3.0)], [torch.zeros(1)])
    writer.close()


def test_background_writes_run_in_order_and_raise_in_the_callers_thread():
    writes, done = BackgroundWrites(), []
    for k in range(5):
        writes.put(lambda k=k: done.append(k))
    writes.drain()
    assert done == [0, 1, 2, 3, 4] and not writes.busy()

    def fail():
        raise ValueError("bad write")
    writes.put(fail)
    writes.put(lambda: done.append(5))
    with pytest.raises(ValueError, match="bad write"):
        writes.drain()
    writes.put(lambda: done.append(6))   # after a failure nothing runs, even once the caller was told
    writes.drain()
    writes.close()
    assert done == [0, 1, 2, 3, 4]


def test_persisted_values_are_written_once_and_their_new_bytes_counted(client, keys):
    # one script per flush sets the losses (ravop.store.value_writes); a value already there (written before a
    # worker died) is kept, not written again, and only the values stored now count as written bytes
    metrics = WorkerMetrics("w-writes")
    writer = writer_for(client, keys, metrics=metrics)
    client.set(keys.tensor(101), encode_tensor(torch.tensor(-1.0)))   # step 2's loss, from an earlier run
    for step in range(1, 4):
        writer.on_step(step, 0, step - 1, [torch.tensor(float(step))], [torch.zeros(3)])
    writer.write(3)
    assert [decode_tensor(client.get(keys.tensor(100 + run))).item() for run in range(3)] == [1.0, -1.0, 3.0]
    written = {(s.name, tuple(s.labels.values())): s.value for family in metrics.registry.collect()
               for s in family.samples}[("ravop_worker_store_written_bytes_total", ("w-writes",))]
    # losses 1 and 3 (4 bytes each) and the checkpoint of step 2 (3 floats)
    assert written == 2 * 4 + 3 * 4
    writer.close()
