"""Big constants whose chunks go up after the graph has started: R.activate() no longer waits for them (188 MB of
MNIST: ~0.15 s of its ~0.36 s), and local workers, which map the constant's same-host file, never wait either.

Which constants: those the same-host path wrote to a sealed memory file (`ravop.store.same_host`), unless
persisted (R.fetch_persisting_op reads those as any value, at once). Only those, because the sealed file is an
immutable copy of the tensor taken before R.activate() returns: the chunks sent later are the file's bytes, the
very bits local workers map, whatever the caller does with its tensor afterwards; and a worker of the host
maps it without waiting. Without a file, sending later would mean sending memory the caller may change meanwhile
(or making the copy this saves), and every worker would wait for the chunks anyway. Once a constant's chunks are all
sent its file is closed: a worker that mapped it keeps its mapping, a later one reads the chunks, and the requester
holds no copy of what it only uploaded (a model's parameters: issue 46).

Protocol. With the graph's other keys (before its meta) R.activate() writes the constant's marker `{key}:u`, a
hash of `header` (the chunked header its key will hold), `sent` (bytes of chunks sent) and `patience` (seconds
a reader waits for `sent` to move), instead of its header. A thread of the requester then sends the chunks
from the file in batches, each a transaction that runs only while the marker exists (the workers released the
constant, or R.flush deleted it: the thread stops, and nothing is written after), and ends with one
transaction that sets the header and deletes the marker. So, as for every tensor, a reader that finds the header
finds every chunk: nobody reads a partial tensor.

A reader that finds no header but a marker (`read_uploaded`, a worker's inputs) maps the same-host file where it
may (no wait); else it waits for the header (remote workers, a cluster, a mapping refused, RAVOP_SAME_HOST=off
on the worker), and gives up, naming the tensor, when `sent` has not moved for `patience` seconds (the requester
died mid-upload, or its link stalled: the graph fails with that error) or the graph ends. A reader takes at
most MAX_PATIENCE_SECONDS from a marker: a hostile token user's marker holds a worker at most that long between
two moves of its count, and a token user can occupy a worker with its own graph anyway (a long training loop).

The requester's side keeps order with the thread: R.flush stops it (`abandon`) before deleting; a session that
closes its connection lets it finish (`finish`); the thread is not a daemon, so the interpreter's exit waits for
it (before atexit stops an embedded server): a graph left running when the requester exits (R.execute() and
leave) has every chunk. A failed upload fails the graph, its error naming the tensor, and prints that line.
"""
import logging
import math
import sys
import threading
import time
from typing import Callable, List, NamedTuple, Optional, Union

import redis
import torch

from ..core import graph_states
from ..core.errors import UploadIncompleteError
from ..wire.codec import chunked_header, decode_chunked
from . import same_host
from .client_types import Client, Pipeline
from .keys import GraphKeys
from .row_stream import StreamedRows
from .tensors import check_budget, chunks_key, decode, marker_key

log = logging.getLogger("ravop.store")

PATIENCE_SECONDS = 60.0        # a reader's wait for the next batch (8 MiB) before it calls the upload dead
MAX_PATIENCE_SECONDS = 600.0   # the most a reader takes from a marker
BATCH_BYTES = 8 * 2**20        # one transaction: the sent count moves at least this often
POLL_SECONDS = (0.001, 0.05)   # a waiting reader's first and longest pause between looks


class Deferred(NamedTuple):
    """A constant sent after the start: its tensor key, header, bytes (its sealed file, mapped), chunk size and
    the file's reference."""
    key: str
    header: bytes
    data: memoryview
    chunk: int
    reference: str


def deferred(pipe: Pipeline, key: str, tensor: torch.Tensor, chunk: int, reference: str) -> Deferred:
    """`tensor`, whose sealed file `reference` names, to be sent later in chunks of `chunk` bytes; its marker is
    queued on `pipe` (R.activate()'s upload, before the graph's meta)."""
    item = Deferred(key, chunked_header(tensor, chunk), same_host.sealed_bytes(reference), chunk, reference)
    pipe.hset(marker_key(key), mapping={"header": item.header, "sent": 0, "patience": PATIENCE_SECONDS})
    return item


class _Upload(threading.Thread):
    """Sends the chunks of one graph's deferred constants, then their headers."""

    def __init__(self, client: Client, keys: GraphKeys, items: List[Deferred],
                 on_failure: Callable[[str], object]) -> None:
        super().__init__(name=f"ravop-upload-{keys.graph_id}", daemon=False)   # exit waits for it (docstring)
        self.client, self.keys, self.items, self.on_failure = client, keys, items, on_failure
        self.cancelled = threading.Event()

    def run(self) -> None:
        item = None
        try:
            for index, item in enumerate(self.items):
                self._send(item)
                # Its chunks are all in the server (or it was released): the file goes. A worker that mapped it keeps
                # its mapping; one that comes later reads the chunks. Kept open, it would hold a copy of every big
                # constant (a model's parameters) in the requester's memory until R.flush (issue 46).
                self.items[index] = item = item._replace(data=memoryview(b""))
                same_host.close_file(item.reference)
        except Exception as exc:  # noqa: BLE001 - any failure ends the upload: said, and the graph fails
            assert item is not None
            error = (f"the requester's upload of constant {item.key} ({len(item.data) / 2**20:,.1f} MiB) failed: "
                     f"{type(exc).__name__}: {exc}")
            print(f"ravop: {error}; graph {self.keys.graph_id} fails", file=sys.stderr)
            try:
                self.on_failure(error)
            except Exception as again:  # noqa: BLE001 - the server is gone too: said as well
                print(f"ravop: could not mark graph {self.keys.graph_id} failed either: {again}", file=sys.stderr)
        finally:
            self.items = []   # unmaps the files once the sends' views are gone
            with _lock:
                _running.remove(self)

    def _send(self, item: Deferred) -> None:
        size = len(item.data)
        per_batch = max(1, BATCH_BYTES // item.chunk)
        starts = range(0, size, item.chunk)
        for first in range(0, len(starts), per_batch):
            held_before_sending(item.key)
            if self.cancelled.is_set():
                return
            batch = range(first, min(first + per_batch, len(starts)))
            sent = min((batch[-1] + 1) * item.chunk, size)

            def chunks(pipe: Pipeline, batch: range = batch, sent: int = sent) -> None:
                for index in batch:
                    pipe.hset(chunks_key(item.key), index, item.data[starts[index]:starts[index] + item.chunk])
                pipe.hset(marker_key(item.key), "sent", sent)
            if not self._while_marked(item, chunks):
                return
        self._while_marked(item, lambda pipe: (pipe.set(item.key, item.header), pipe.delete(marker_key(item.key))))

    def _while_marked(self, item: Deferred, writes: Callable[[Pipeline], object]) -> bool:
        """Run `writes` as one transaction if the marker still exists; False once it does not (released or
        flushed: nothing more is written for it)."""
        marker = marker_key(item.key)
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(marker)
                    if not pipe.exists(marker):
                        return False
                    pipe.multi()
                    writes(pipe)
                    pipe.execute()
                    return True
                except redis.WatchError:   # changed meanwhile (deleted, or a stranger's write): look again
                    continue


def held_before_sending(key: str) -> None:
    """Called before each batch: tests replace it to hold an upload unfinished until a reader waits for it."""


_lock = threading.Lock()
_running: List[_Upload] = []


def start(client: Client, keys: GraphKeys, items: List[Deferred], on_failure: Callable[[str], object]) -> None:
    """Send `items` (their markers already written) on a thread; `on_failure(error)` if that fails."""
    if not items:
        return
    upload = _Upload(client, keys, items, on_failure)
    with _lock:
        _running.append(upload)
    upload.start()


def _of(token: str) -> List[_Upload]:
    with _lock:
        return [upload for upload in _running if upload.keys.token == token]


def finish(token: str) -> None:
    """Wait for this process's uploads of `token` to end."""
    for upload in _of(token):
        upload.join()


def abandon(token: str) -> None:
    """Stop this process's uploads of `token` after their current batch (R.flush, which deletes what they wrote)."""
    uploads = _of(token)
    for upload in uploads:
        upload.cancelled.set()
    for upload in uploads:
        upload.join()


def read_uploaded(client: Client, keys: GraphKeys, key: str, max_bytes: Optional[int] = None,
                  stream_to: Optional[str] = None) -> Union[torch.Tensor, StreamedRows, None]:
    """The constant under `key`, which has no header: mapped from its same-host file where this reader may, else
    read once its upload is complete (a wait it logs; with `stream_to`, its rows stream once it is complete:
    `ravop.store.tensors.decode`); None if it has no marker either (not in Redis: flushed, or released).
    `UploadIncompleteError` naming it if the upload stops moving for its patience or the graph ends first;
    `WireFormatError` for a marker whose header is not one, or over `max_bytes`."""
    # The marker first, the key after, in every look: the upload's last step sets the key and deletes the marker at
    # once, so a marker found gone means the key is there (unless the tensor is gone too).
    marker = marker_key(key)
    pipe = client.pipeline(transaction=False)
    pipe.hmget(marker, "header", "patience")
    pipe.get(key)
    (header, patience), data = pipe.execute()
    if header is None:
        return None if data is None else decode(client, key, data, max_bytes, token=keys.token, stream_to=stream_to)
    head = decode_chunked(header)
    if stream_to is None:
        check_budget(key, head, max_bytes)
    mapped = same_host.read(client, key, head, keys.token)
    if mapped is not None:
        return mapped
    wait = _patience(patience)
    log.info("input %s: its requester is still uploading it; waiting", key)
    last, since, pause = None, time.monotonic(), POLL_SECONDS[0]
    while True:
        pipe = client.pipeline(transaction=False)
        pipe.hget(marker, "sent")
        pipe.hget(keys.meta, "state")
        pipe.get(key)
        sent, state, data = pipe.execute()
        if data is not None:
            return decode(client, key, data, max_bytes, token=keys.token, stream_to=stream_to)
        if sent is None:
            return None
        if state is None or state.decode(errors="replace") not in graph_states.LIVE:
            raise UploadIncompleteError(f"constant {key}: the graph ended ({(state or b'deleted').decode()}) before "
                                        f"its requester's upload did ({_sent(sent, head.nbytes)})")
        now = time.monotonic()
        if sent != last:
            last, since = sent, now
        elif now - since > wait:
            raise UploadIncompleteError(
                f"constant {key}: its requester's upload made no progress for {wait:g} s "
                f"({_sent(sent, head.nbytes)}): the requester stopped (exited?) before it finished; activate the "
                "graph again")
        time.sleep(pause)
        pause = min(pause * 2, POLL_SECONDS[1])


def _patience(value: Optional[bytes]) -> float:
    """A marker's patience, within [1, MAX_PATIENCE_SECONDS] (PATIENCE_SECONDS for one that is not a number)."""
    try:
        seconds = float(value or b"")
    except ValueError:
        return PATIENCE_SECONDS
    return min(max(seconds, 1.0), MAX_PATIENCE_SECONDS) if math.isfinite(seconds) else PATIENCE_SECONDS


def _sent(sent: bytes, total: int) -> str:
    return f"{sent.decode(errors='replace')[:20]} of {total:,} bytes sent"
