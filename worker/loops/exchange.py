"""How a resident replica's loop reaches the other loops of its graph (`ravop.runtime.loop_run.Exchange`): a value sent
on a channel at run r is one tensor in the store under `keys.exchange(channel, r)`, written with SET NX (a
replica resumed from its checkpoint sends the same bits again, and the first write stands); receiving polls
until every value of the run is there, but for values a step receives as optional (DiLoCo's `close_after`): those
are waited for a bounded time, and which ones the run went without is recorded, for its replays (`_receive_closing`). Only these values cross the network per round: the replica's
parameters, optimizer state and data shard stay in the worker's memory (and its loop checkpoint).

Over a slow link every round trip counts (a provider 50 ms from the store), so the loop waits on none it can
avoid: a send is written by a thread beside the loop (in order; the loop goes on computing, and waits for the
writes only before a checkpoint, which must never name a step whose values are not in the store, and at its
end); a receive reads the values with one MGET (again only those still missing, while it waits), and once a
template has received run r, run r + 1 of the same channels is fetched in the background as soon as its values
appear (a round's update is there before the replica needs it: then receiving costs nothing).

While it waits, the loop checks the graph is still running (else `LoopAbandoned`) and whether the worker is
stopping or should give the loop up (then it checkpoints what it has and hands the loop back). Those reads are
several round trips (the graph's state, the work stream, the workers' liveness), so they are made beside the
loop, and the loop acts on them (`on_wait`) only when one says it must: a receive returns as soon as its values
are here, never after a check that happened to be under way (over a 50 ms link a check in the loop's thread
held every wait longer than `STATE_SECONDS` a further 0.1-0.2 s, and a late outer step made every replica late).

A value is deleted once every loop that reads it (the graph meta's `exchange_readers`, counted by the
requester from the plan) has checkpointed past the step that read it: after each checkpoint, the loop counts
itself on each value it read since the one before (INCR of `{key}:acks`), and the reader that completes the count
deletes the value. A reader resumed from its checkpoint reads only values after it, which no one deleted. So
the store holds the rounds since the readers' last checkpoints, not every round of the fit."""
import functools
import json
import logging
import re
import threading
import time
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Union

from redis.exceptions import NoPermissionError

from ravop.core import graph_states
from ravop.core.errors import PlanError
from ravop.store.client_types import Client
from ravop.store.keys import GraphKeys
from ravop.wire import decode_tensor, encode_tensor

from ..execute import device as devices
from . import late_rounds
from .background_writes import BackgroundWrites

CHANNEL = re.compile(r"[A-Za-z0-9_.-]{1,64}")
log = logging.getLogger("ravop.worker")
POLL_SECONDS = (0.0005, 0.02)   # first and longest pause between two looks at the store
STATE_SECONDS = 0.5             # how often a waiting loop checks that its graph still runs


def check_channels(channels: Iterable[object]) -> None:
    for channel in channels:
        if not isinstance(channel, str) or not CHANNEL.fullmatch(channel):
            raise PlanError(f"a loop exchange channel must be 1 to 64 letters, digits, '_', '.' or '-', not "
                            f"{channel!r}")


class StoreExchange:
    """The exchange of one loop run by this worker. While a receive waits, the graph's state and `attention()`
    (whether the worker is stopping or should give the loop up; None: never) are read beside the loop every
    `STATE_SECONDS`; when the graph is not running or `attention()` is true, `on_wait(state)` is called in the
    loop's thread: it raises to stop the wait. `meta`: the graph meta's fields as the worker read them before the
    loop (worker/loops/loop_start.py), or None (its `exchange_readers` is read here). `close()` when the loop ends."""

    def __init__(self, client: Client, keys: GraphKeys, device: Union[str, Any],
                 on_wait: Callable[[Optional[bytes]], None],
                 attention: Optional[Callable[[], bool]] = None,
                 meta: Optional[Mapping[str, Optional[bytes]]] = None) -> None:
        self.client, self.keys, self.device, self.on_wait, self.attention = client, keys, device, on_wait, attention
        self.sent_bytes = self.received_bytes = 0
        self.readers = _readers(client.hget(keys.meta, "exchange_readers") if meta is None
                                else meta["exchange_readers"])
        self.read_keys: list[tuple[str, str]] = []   # keys read since the last checkpoint, with their channel
        self.sends = BackgroundWrites(queued=0, name="exchange-send")   # in order, beside the loop
        # (channels, run) -> the _Fetch running ahead for it
        self.prefetched: dict[tuple[tuple[str, ...], int], _Fetch] = {}

    def take_reads(self) -> list[tuple[str, str]]:
        """The (key, channel) pairs read since the last call: what a checkpoint taken now read before it."""
        reads, self.read_keys = self.read_keys, []
        return reads

    def release(self, reads: Optional[Sequence[tuple[str, str]]]) -> None:
        """After a checkpoint: count this loop on every value it read before it (`reads`, from `take_reads` when
        the checkpoint was taken: it may be written beside the loop, which reads on meanwhile), deleting those
        every reader has counted itself on."""
        if not reads:
            return
        pipe = self.client.pipeline(transaction=False)
        for key, _ in reads:
            pipe.incr(f"{key}:acks")
        counts = pipe.execute()
        done = [key for (key, channel), count in zip(reads, counts)
                if channel in self.readers and count >= self.readers[channel]]
        if done:
            try:
                self.client.delete(*done, *(f"{key}:acks" for key in done))
            except NoPermissionError:   # a worker user made before exchanges were released: keep them, and go on
                log.warning("this worker's ACL user may not delete exchanged values (recreate it with `ravop "
                            "admin worker create`): they stay in the store until the graph is flushed")
                self.readers = {}

    def send(self, channels: Sequence[str], run: int, values: Sequence[Any]) -> None:
        """Queue the values' writes (encoded now: the loop may update the tensors in place afterwards)."""
        check_channels(channels)
        items: list[tuple[str, bytes]] = []
        for channel, value in zip(channels, values):
            data = encode_tensor(devices.to_host(value).contiguous())
            self.sent_bytes += len(data)
            items.append((self.keys.exchange(channel, run), data))
        self.sends.put(functools.partial(_write_sent, self.client, items))

    def flush(self) -> None:
        """Wait until every value sent is in the store (before a checkpoint, and at the loop's end)."""
        self.sends.drain()

    def receive(self, channels: Sequence[str], run: int, optional: Sequence[bool] = (),
                close_after: float = 0.0) -> List[Any]:
        check_channels(channels)
        self.sends.check()
        if any(optional):
            return self._receive_closing(channels, run, optional, close_after)
        key = (tuple(channels), run)
        fetch = self.prefetched.pop(key, None) or _Fetch(self.client, [self.keys.exchange(c, run) for c in channels])
        self._wait(fetch)
        found = fetch.complete()
        self.received_bytes += sum(len(data) for data in found)
        self.read_keys += zip(fetch.names, channels)
        ahead = (tuple(channels), run + 1)
        self.prefetched[ahead] = _Fetch(self.client, [self.keys.exchange(c, run + 1) for c in channels],
                                        background=True)
        return [devices.to_device(decode_tensor(data), self.device) for data in found]

    def _wait(self, fetch: "_Fetch", deadline: Optional[float] = None) -> bool:
        """Whether `fetch` got every value before `deadline` (time.monotonic; None: it waits for all), looking at
        the graph's state and `attention()` beside the wait."""
        checked, check = time.monotonic(), None
        while not fetch.wait(POLL_SECONDS[1] if fetch.background else None):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            if check is None and time.monotonic() - checked >= STATE_SECONDS:
                check = _Check(self.client, self.keys.meta, self.attention)
            if check is not None and check.done.is_set():
                if check.act():   # raises a failed read
                    self.on_wait(check.state)
                checked, check = time.monotonic(), None
        return True

    def _receive_closing(self, channels: Sequence[str], run: int, optional: Sequence[bool],
                         close_after: float) -> List[Any]:
        """`receive` of a step whose optional values are waited for at most `close_after` s from now. Which ones
        the run went without is recorded first (SET NX under `without.{first channel}`): a replay of the run (the
        loop resumed from a checkpoint, here or elsewhere) goes without the same ones, so that what it sends again
        is what it sent (the first write stands) and its state is what the others saw."""
        deadline = time.monotonic() + close_after
        names = [self.keys.exchange(c, run) for c in channels]
        required = [k for k, flag in enumerate(optional) if not flag]
        flagged = [k for k, flag in enumerate(optional) if flag]
        found: list[Any] = [None] * len(channels)   # bytes where read
        for group, until in [(group, until) for group, until in ((required, None), (flagged, deadline)) if group]:
            fetch = _Fetch(self.client, [names[k] for k in group])
            self._wait(fetch, until)
            for k, data in zip(group, fetch.values()):
                found[k] = data
        decision = self.keys.exchange(f"without.{channels[0]}", run)
        pipe = self.client.pipeline(transaction=True)
        pipe.set(decision, json.dumps([k for k in flagged if found[k] is None]), nx=True)
        pipe.get(decision)
        without = set(json.loads(pipe.execute()[-1]))
        late = [k for k in flagged if found[k] is None and k not in without]
        if late:   # recorded as present by a run before this replay: they are in the store
            fetch = _Fetch(self.client, [names[k] for k in late])
            self._wait(fetch)
            for k, data in zip(late, fetch.values()):
                found[k] = data
        if without:
            # marked per value, so that a replica that missed the close drops the rest of its round
            # (worker/loops/late_rounds.py); written again by a replay, to the same effect
            pipe = self.client.pipeline(transaction=False)
            for k in sorted(without):
                pipe.set(self.keys.exchange(late_rounds.mark(channels[k]), run), 1)
            pipe.execute()
            log.info("loop exchange run %d of %s went without %s (not there within %.3g s)", run, channels[0],
                     ", ".join(channels[k] for k in sorted(without)), close_after)
        read = [k for k in range(len(channels)) if k not in without]
        self.received_bytes += sum(len(found[k]) for k in read)
        self.read_keys += [(names[k], channels[k]) for k in read]
        return [None if k in without else devices.to_device(decode_tensor(found[k]), self.device)
                for k in range(len(channels))]

    def close(self) -> None:
        """Stop fetching ahead and the sender (what was queued is written first, unless a write failed)."""
        for fetch in self.prefetched.values():
            fetch.stop()
        self.prefetched = {}
        self.sends.close()


class _Check:
    """One look beside the loop at whether a waiting loop must act: the graph's state, then `attention()` (each is
    a round trip or more). The loop reads the answer when `done` is set, or drops it once its values are here."""

    def __init__(self, client: Client, meta: str, attention: Optional[Callable[[], bool]]) -> None:
        self.client, self.meta, self.attention = client, meta, attention
        self.state: Optional[bytes] = None
        self.error: Optional[Exception] = None
        self.must = False
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="exchange-check").start()

    def _run(self) -> None:
        try:
            self.state = self.client.hget(self.meta, "state")
            self.must = self.state != graph_states.RUNNING.encode() or bool(self.attention and self.attention())
        except Exception as exc:   # raised in the loop's thread, as the read it replaces would have been
            self.error = exc
        finally:
            self.done.set()

    def act(self) -> bool:
        """Whether the loop must call `on_wait` (after `done`); raises the read's error."""
        if self.error is not None:
            raise self.error
        return self.must


class _Fetch:
    """The values of some exchange keys: each MGET asks only for those still missing (a value never changes
    once written). In the background, a thread polls until all are there; else `wait` polls in the caller's
    thread for up to `POLL_SECONDS[1]` (the caller checks the graph's state between waits)."""

    def __init__(self, client: Client, names: Sequence[str], background: bool = False) -> None:
        self.client, self.names, self.background = client, names, background
        self.found: list[Optional[bytes]] = [None] * len(names)
        self.pause = POLL_SECONDS[0]
        self.done, self.stopped = threading.Event(), threading.Event()
        self.error: Optional[Exception] = None
        if background:
            threading.Thread(target=self._run, daemon=True, name="exchange-fetch").start()

    def _poll(self) -> bool:
        missing = [k for k, data in enumerate(self.found) if data is None]
        for k, data in zip(missing, self.client.mget([self.names[k] for k in missing])):
            self.found[k] = data
        if all(data is not None for data in self.found):
            self.done.set()
        return self.done.is_set()

    def _run(self) -> None:
        try:
            while not self.stopped.is_set() and not self._poll():
                self.stopped.wait(self.pause)
                self.pause = min(self.pause * 2, POLL_SECONDS[1])
        except Exception as exc:   # reported to the loop when it receives: it fetches in its own thread then
            self.error = exc
            self.done.set()

    def wait(self, timeout: Optional[float]) -> bool:
        """Whether every value is here (polling once, or waiting up to `timeout` s for the thread)."""
        if not self.background:
            if self._poll():
                return True
            time.sleep(self.pause)
            self.pause = min(self.pause * 2, POLL_SECONDS[1])
            return False
        if not self.done.wait(timeout):
            return False
        if self.error is not None:   # a fetch that failed in the background is done again here
            self.background, self.error = False, None
            self.done.clear()
            return self.wait(timeout)
        return True

    def values(self) -> list[Optional[bytes]]:
        return list(self.found)

    def complete(self) -> list[bytes]:
        """Every value, once a wait without a deadline returned (it returns only when all are here)."""
        found = [data for data in self.found if data is not None]
        if len(found) < len(self.found):
            raise RuntimeError(f"exchange values {self.names} read before they were all there")
        return found

    def stop(self) -> None:
        self.stopped.set()


def _write_sent(client: Client, items: Sequence[tuple[str, bytes]]) -> None:
    """One send's values (SET NX: a replica resumed from its checkpoint sends the same bits again, and the first
    write stands)."""
    pipe = client.pipeline(transaction=False)
    for key, data in items:
        pipe.set(key, data, nx=True)
    pipe.execute()


def _readers(meta_field: Optional[Union[bytes, str]]) -> dict[str, int]:
    """{channel: readers} from the graph meta (a plan from before it, or a malformed field: {}, nothing is
    deleted)."""
    try:
        readers = json.loads(meta_field) if meta_field else {}
    except ValueError:
        return {}
    if not isinstance(readers, dict):
        return {}
    return {str(k): v for k, v in readers.items() if type(v) is int and v >= 1}
