"""Tensors in Redis, of any size. A tensor up to `chunk_bytes()` is one string value (header and data); a
bigger one is a chunked header under its key and its data in a hash `{key}:c` of chunks ("0", "1", ...),
because one Redis value is capped (proto-max-bulk-len, 512 MB by default) and because a single huge value
costs whole extra copies on both ends.

Writing sends the tensor's own memory (nothing is copied before the socket): a chunked tensor's chunks as views
of it, the header after them, so a reader that sees the header finds every chunk; a tensor of one value (above
the packer's cutoff) as its header and a view of its data, one value never joined (`command_packer.Joined`).
Reading allocates the tensor once, receives every chunk from the socket straight into it, and returns a view of
that memory with the stored dtype and shape: no copy of the data besides the one the kernel makes.
"""
import os
import socket
from typing import Any, Callable, List, Optional, Tuple, Union

import redis
import torch

from ..core import progress
from ..core.errors import StoreLimitError, WireFormatError
from ..wire.codec import Chunked, decode_chunked, decode_tensor, encode_chunked, encode_tensor, is_chunked, \
    tensor_pieces
from . import same_host
from .command_packer import BUFFER_CUTOFF, Joined
from .client_types import Client, Pipeline
from .connect import node_client
from .row_stream import StreamedRows

DEFAULT_CHUNK_BYTES = 4 * 2**20  # measured: 1-8 MiB move 100 MB fastest over the embedded unix socket
HEADER_BYTES = 6 + 8 * 32 + 12   # the longest tensor header (ravop.wire.codec)
# Chunks asked for in one pipeline when a whole tensor is read: the server queues every reply of a pipeline in
# its output buffer before the socket drains it, so one pipeline of all the chunks held the data twice there.
READ_BATCH_BYTES = 64 * 2**20


def chunk_bytes() -> int:
    """Largest value written in one piece ($RAVOP_CHUNK_BYTES, default 4 MiB)."""
    value = int(os.environ.get("RAVOP_CHUNK_BYTES", DEFAULT_CHUNK_BYTES))
    if value < 1:
        raise ValueError(f"RAVOP_CHUNK_BYTES must be positive, not {value}")
    return value


def chunks_key(key: str) -> str:
    return key + ":c"


def marker_key(key: str) -> str:
    """A big constant's upload marker, while its chunks are being sent (ravop.store.background_upload)."""
    return key + ":u"


def _config_value(reply: Any, name: str) -> int:
    """A CONFIG GET reply's value (0 if CONFIG is refused: some managed services disable it, a `ravop admin` user
    is not given it; the server's other errors remain)."""
    if isinstance(reply, redis.ResponseError):
        return 0
    if isinstance(reply, Exception):
        raise reply
    return int(reply.get(name, 0))


def fit_to_server(client: Client, total_bytes: int = 0, what: str = "values", key: Optional[str] = None) -> int:
    """The chunk size to write with on this server (at most its proto-max-bulk-len), after checking that
    `total_bytes` more fit under its maxmemory; `StoreLimitError` naming the numbers otherwise. On a cluster:
    the server that holds `key` (a key of the graph written to). One round trip."""
    client = node_client(client, key)
    pipe = client.pipeline(transaction=False)
    pipe.config_get("proto-max-bulk-len")
    if total_bytes:
        pipe.info("memory")  # INFO, not CONFIG GET: a `ravop admin` user is not given CONFIG
    replies = pipe.execute(raise_on_error=False)
    size = chunk_bytes()
    max_bulk = _config_value(replies[0], "proto-max-bulk-len")
    if max_bulk:
        size = min(size, max_bulk - HEADER_BYTES)
    if not total_bytes:
        return size
    memory = replies[1]
    if isinstance(memory, Exception):
        raise memory
    maxmemory, used = int(memory.get("maxmemory", 0)), int(memory["used_memory"])
    if maxmemory and used + total_bytes > maxmemory:
        raise StoreLimitError(
            f"{what} need {total_bytes / 2**20:.1f} MiB in Redis, but the server has "
            f"{max(maxmemory - used, 0) / 2**20:.1f} MiB free under its maxmemory of {maxmemory / 2**20:.1f} "
            "MiB: raise maxmemory (CONFIG SET maxmemory ...), free space (R.flush()), or use smaller tensors")
    return size


def write(pipe: Pipeline, key: str, tensor: torch.Tensor, size: Optional[int] = None,
          chunks_pipe: Optional[Pipeline] = None, queued: Optional[Callable[[int], None]] = None) -> int:
    """Queue the writes of `tensor` under `key` on `pipe` (a redis-py pipeline), in values of at most
    `size` bytes (default `chunk_bytes()`; see `fit_to_server`). Returns the bytes queued.

    `queued(n)` is called after each value of n bytes is queued: a caller may send the pipeline from it (the
    chunks go in order, the header last), so that a big tensor leaves in pieces it can show progress on.

    `chunks_pipe`: where the chunks go instead, sent before `pipe`, for a `pipe` that is a transaction:
    the server counts what a MULTI has queued against the client's query buffer limit (1 GB by default),
    so a big tensor's chunks cannot be part of one; the header, which makes the tensor visible, still is."""
    size = size or chunk_bytes()
    queued = queued or _ignore
    if tensor.nbytes <= size:
        value: Union[Joined, bytes]
        # its header and a view of the tensor's memory (no copy); not on a Redis Cluster, whose node connections may
        # pack with redis-py's own packer, which refuses a Joined
        if tensor.nbytes > BUFFER_CUTOFF and not isinstance(pipe, redis.cluster.ClusterPipeline):
            value = Joined(*tensor_pieces(tensor))
            written = value.nbytes
        else:
            value = encode_tensor(tensor)
            written = len(value)
        pipe.set(key, value)
        queued(written)
        return written
    header, chunks = encode_chunked(tensor, size)
    chunks_pipe = pipe if chunks_pipe is None else chunks_pipe
    chunks_pipe.delete(chunks_key(key))  # a rewrite (a retry) replaces the chunks instead of adding to them
    for index, chunk in enumerate(chunks):
        chunks_pipe.hset(chunks_key(key), index, chunk)
        queued(len(chunk))
    pipe.set(key, header)
    queued(len(header))
    return tensor.nbytes + len(header)


def _ignore(size: int) -> None:
    pass


def keys_of(key: str) -> Tuple[str, str, str, str]:
    """Every Redis key a stored tensor may occupy (to delete it): its value or header, chunks, same-host reference
    and upload marker (ravop.store.background_upload)."""
    return key, chunks_key(key), same_host.reference_key(key), marker_key(key)


def check_budget(key: str, head: Chunked, max_bytes: Optional[int]) -> None:
    """`WireFormatError` if the chunked tensor `head` declares more than `max_bytes` (a reader's memory budget)."""
    if max_bytes is not None and head.nbytes > max_bytes:
        raise WireFormatError(f"chunked tensor {key}: its header declares {tuple(head.shape)} "
                              f"{str(head.dtype).removeprefix('torch.')} ({head.nbytes / 2**20:,.1f} MiB), over "
                              f"this reader's memory budget of {max_bytes / 2**20:,.1f} MiB")


SIZES_PER_ROUND_TRIP = 4096   # HSTRLENs pipelined at once: a header of a million chunks costs no big reply


def decode(client: Client, key: str, data: bytes, max_bytes: Optional[int] = None,
           desc: Optional[str] = None, token: Optional[str] = None,
           reference: Any = same_host.UNREAD, stream_to: Optional[str] = None
           ) -> Union[torch.Tensor, StreamedRows, None]:
    """The tensor whose stored value under `key` is `data` (reading its chunks if it has any); None if the
    chunks are gone (deleted meanwhile); `WireFormatError` for a value that is not a tensor, or a chunked one
    whose header declares more than `max_bytes` (a reader's memory budget) or other chunks than are stored.
    With `desc`, a chunked tensor's download shows a progress bar in bytes (once it has taken a second). With
    `token` (the graph's), a chunked tensor is read from its same-host file where it has one it may follow
    (`ravop.store.same_host`; `reference`: its reference, where the caller read it already). With `stream_to`
    (a device), a chunked tensor read from the store is not read now: its rows stream to that device as a loop
    reads them (`ravop.store.row_stream`); `max_bytes` then bounds its chunks, not the whole tensor, which is never
    held (the reader holds a window of a few of the loop's batches)."""
    if not is_chunked(data):
        return decode_tensor(data)
    head = decode_chunked(data)
    # A hostile or stale header must not make the reader allocate, or even ask about, what it declares: its
    # size against the budget, then its chunk count against the hash's (one HLEN), before any chunk is read.
    if stream_to is None:
        check_budget(key, head, max_bytes)
    elif max_bytes is not None and head.chunk_bytes > max_bytes:
        raise WireFormatError(f"chunked tensor {key}: its header declares chunks of {head.chunk_bytes:,} bytes, over "
                              f"this reader's memory budget of {max_bytes / 2**20:,.1f} MiB")
    client = node_client(client, key)  # its chunks are read from the socket of the server that holds them
    if token is not None:   # a mapped file is shared with its writer, not this reader's memory: never streamed
        local = same_host.read(client, key, head, token, reference)
        if local is not None:
            return local
    hash_key = chunks_key(key)
    if stream_to is not None:   # each chunk's size is checked as it is read: no round trip before the first step
        return StreamedRows(key, head, lambda index: _read_chunk(client, hash_key, head, index), stream_to)
    expected = _stored_sizes(client, key, head)
    if expected is None:
        return None
    # torch.empty, not bytearray: a bytearray is zero-filled first, which costs as much as the read itself.
    raw = torch.empty(head.nbytes, dtype=torch.uint8)
    view = memoryview(raw.numpy())
    per_batch = max(1, READ_BATCH_BYTES // max(head.chunk_bytes, 1))
    with progress.bar(head.nbytes, desc, unit="B", unit_scale=True, disable=desc is None) as received:
        for first in range(0, head.n_chunks, per_batch):
            batch = range(first, min(first + per_batch, head.n_chunks))
            if not _read_replies_into(client, [("HGET", hash_key, i) for i in batch], view,
                                      [i * head.chunk_bytes for i in batch], [expected[i] for i in batch],
                                      received.update):
                return None  # deleted (or replaced) while being read
    return raw.view(head.dtype).reshape(head.shape)


def _stored_sizes(client: Client, key: str, head: Chunked) -> Optional[List[int]]:
    """The sizes of `head`'s chunks, checked against those stored (one HLEN, then HSTRLENs): None if they are
    gone, `WireFormatError` if they are not the header's."""
    hash_key = chunks_key(key)
    stored_chunks = client.hlen(hash_key)
    if head.n_chunks and not stored_chunks:
        return None
    if stored_chunks != head.n_chunks:
        raise WireFormatError(f"chunked tensor {key}: its header declares {head.n_chunks} chunks of "
                              f"{head.chunk_bytes} bytes ({head.nbytes} in all) but {stored_chunks} are stored")
    sizes = []
    for first in range(0, head.n_chunks, SIZES_PER_ROUND_TRIP):
        pipe = client.pipeline(transaction=False)
        for index in range(first, min(first + SIZES_PER_ROUND_TRIP, head.n_chunks)):
            pipe.hstrlen(hash_key, index)
        sizes += pipe.execute()
    if head.n_chunks and not any(sizes):
        return None
    expected = [head.chunk_size(i) for i in range(head.n_chunks)]
    if sizes != expected:
        raise WireFormatError(f"chunked tensor {key}: chunk sizes {sizes[:4]}... do not match its header "
                              f"({head.n_chunks} chunks of {head.chunk_bytes} bytes, {head.nbytes} in all)")
    return expected


def _read_chunk(client: Client, hash_key: str, head: Chunked, index: int) -> Optional[torch.Tensor]:
    """Chunk `index`'s bytes; None if it is gone or not of the header's size."""
    size = head.chunk_size(index)
    data = torch.empty(size, dtype=torch.uint8)
    return data if _read_replies_into(client, [("HGET", hash_key, index)], memoryview(data.numpy()), [0],
                                      [size]) else None


def _read_replies_into(client: Client, commands: List[Tuple[Any, ...]], view: memoryview, offsets: List[int],
                       sizes: List[int], on_chunk: Callable[[int], Any] = _ignore) -> bool:
    """Send `commands` in one pipeline and read their bulk replies straight from the socket into
    `view[offset:offset + size]`, calling `on_chunk(size)` after each. True, or False if a reply is not a
    bulk of the expected size (a chunk deleted meanwhile).

    Why not redis-py's reply parser: it buffers each reply and hands back a new bytes object (two copies
    of every chunk, and the slower half of a round trip: 100 MB read 3-4x slower than the socket allows).
    Only bulk replies are read here, on a connection checked out for this purpose; anything unexpected
    drops the connection, so nothing half-read goes back to the pool."""
    pool = client.connection_pool
    connection = pool.get_connection()
    healthy = False
    try:
        connection.send_packed_command(connection.pack_commands(commands))
        sock = connection._sock  # redis-py has no public way to read a reply into a caller's buffer
        pending = bytearray()  # bytes received past the current reply
        for offset, size in zip(offsets, sizes):
            pending = _receive_line(sock, pending)
            line_end = pending.index(b"\r\n")
            if bytes(pending[:line_end]) != b"$%d" % size:
                return False
            target = view[offset:offset + size]
            have = min(len(pending) - line_end - 2, size)
            target[:have] = pending[line_end + 2:line_end + 2 + have]
            pending = pending[line_end + 2 + have:]
            while have < size:
                received = sock.recv_into(target[have:])
                if not received:
                    raise redis.ConnectionError("connection closed while reading a tensor")
                have += received
            while len(pending) < 2:
                pending += _recv(sock)
            if pending[:2] != b"\r\n":
                return False
            del pending[:2]
            on_chunk(size)
        healthy = not pending
        return healthy
    finally:
        if not healthy:
            connection.disconnect()
        pool.release(connection)


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise redis.ConnectionError("connection closed while reading a tensor")
    return data


def _receive_line(sock: socket.socket, pending: bytearray) -> bytearray:
    while b"\r\n" not in pending:
        pending += _recv(sock)
    return pending


def read(client: Client, key: str) -> Optional[torch.Tensor]:
    """The tensor stored under `key`, or None if there is none."""
    data = client.get(key)
    return None if data is None else decode(client, key, data)
