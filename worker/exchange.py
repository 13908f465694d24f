"""How a resident replica's loop reaches the other loops of its graph (`ravop.loop_run.Exchange`): a value sent
on a channel at run r is one tensor in the store under `keys.exchange(channel, r)`, written with SET NX (a
replica resumed from its checkpoint sends the same bits again, and the first write stands); receiving polls
until every value of the run is there. Only these values cross the network per round: the replica's
parameters, optimizer state and data shard stay in the worker's memory (and its loop checkpoint).

While it waits, the loop checks the graph is still running (else `LoopAbandoned`) and whether the worker is
stopping (then it checkpoints what it has and hands the loop back).

A value is deleted once every loop that reads it (the graph meta's `exchange_readers`, counted by the
requester from the plan) has checkpointed past the step that read it: after each checkpoint, the loop counts
itself on each value it read since the one before (INCR of `{key}:acks`), and the reader that completes the count
deletes the value. A reader resumed from its checkpoint reads only values after it, which no one deleted. So
the store holds the rounds since the readers' last checkpoints, not every round of the fit."""
import json
import logging
import re
import time

from redis.exceptions import NoPermissionError

from ravop.errors import PlanError
from ravop.wire import decode_tensor, encode_tensor

from . import device as devices

CHANNEL = re.compile(r"[A-Za-z0-9_.-]{1,64}")
log = logging.getLogger("ravop.worker")
POLL_SECONDS = (0.0005, 0.02)   # first and longest pause between two looks at the store
STATE_SECONDS = 0.5             # how often a waiting loop checks that its graph still runs


def check_channels(channels):
    for channel in channels:
        if not isinstance(channel, str) or not CHANNEL.fullmatch(channel):
            raise PlanError(f"a loop exchange channel must be 1 to 64 letters, digits, '_', '.' or '-', not "
                            f"{channel!r}")


class StoreExchange:
    """The exchange of one loop run by this worker. `on_wait(state)` is called while waiting: it raises to stop
    the wait (the graph stopped running, or the worker is stopping)."""

    def __init__(self, client, keys, device, on_wait):
        self.client, self.keys, self.device, self.on_wait = client, keys, device, on_wait
        self.sent_bytes = self.received_bytes = 0
        self.readers = _readers(client.hget(keys.meta, "exchange_readers"))
        self.read_keys = []   # keys read since the last checkpoint, with their channel

    def release(self):
        """After a checkpoint: count this loop on every value it read before it, deleting those every reader
        has counted itself on."""
        if not self.read_keys:
            return
        pipe = self.client.pipeline(transaction=False)
        for key, _ in self.read_keys:
            pipe.incr(f"{key}:acks")
        counts = pipe.execute()
        done = [key for (key, channel), count in zip(self.read_keys, counts)
                if channel in self.readers and count >= self.readers[channel]]
        self.read_keys = []
        if done:
            try:
                self.client.delete(*done, *(f"{key}:acks" for key in done))
            except NoPermissionError:   # a worker user made before exchanges were released: keep them, and go on
                log.warning("this worker's ACL user may not delete exchanged values (recreate it with `ravop "
                            "admin worker create`): they stay in the store until the graph is flushed")
                self.readers = {}

    def send(self, channels, run, values):
        check_channels(channels)
        pipe = self.client.pipeline(transaction=False)
        for channel, value in zip(channels, values):
            data = encode_tensor(devices.to_host(value).contiguous())
            self.sent_bytes += len(data)
            pipe.set(self.keys.exchange(channel, run), data, nx=True)
        pipe.execute()

    def receive(self, channels, run):
        check_channels(channels)
        names = [self.keys.exchange(channel, run) for channel in channels]
        pause, checked = POLL_SECONDS[0], time.monotonic()
        while True:
            if self.client.exists(*names) == len(names):   # then read them once: they never change
                found = self.client.mget(names)
                self.received_bytes += sum(len(data) for data in found)
                self.read_keys += zip(names, channels)
                return [devices.to_device(decode_tensor(data), self.device) for data in found]
            now = time.monotonic()
            if now - checked >= STATE_SECONDS:
                self.on_wait(self.client.hget(self.keys.meta, "state"))
                checked = now
            time.sleep(pause)
            pause = min(pause * 2, POLL_SECONDS[1])


def _readers(meta_field):
    """{channel: readers} from the graph meta (a plan from before it, or a malformed field: {}, nothing is
    deleted)."""
    try:
        readers = json.loads(meta_field) if meta_field else {}
    except ValueError:
        return {}
    if not isinstance(readers, dict):
        return {}
    return {str(k): v for k, v in readers.items() if type(v) is int and v >= 1}
