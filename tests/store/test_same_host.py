"""The same-host path for big constants (ravop.store.same_host): a worker on the requester's host and user maps
them from the requester's sealed memory file instead of reading the server's socket, the same bytes; a file it
must not follow is not opened (the chunks are read), a reference or file it must refuse is refused by name, and
a worker survives one on its queue. Real server and worker processes."""
import fcntl
import os

import numpy as np
import pytest
import torch

import ravop as R
from ravop.client.session import require
from ravop.core.errors import GraphFailedError, WireFormatError
from ravop.store import same_host, tensors
from ravop.wire.codec import decode_chunked
from tests.helpers import assert_a_valid_graph_runs

TOKEN = "same-host-test"
KEY = "ravop:same-host-test:{g}:t:1"


@pytest.fixture(autouse=True)
def own_writers(monkeypatch):
    monkeypatch.setattr(same_host, "_writers", {})


@pytest.fixture
def stored(client):
    """A chunked tensor under KEY with its same-host file: (tensor, its header)."""
    tensor = torch.rand(512, 1024)   # 2 MiB, in 1 MiB chunks
    pipe = client.pipeline(transaction=False)
    tensors.write(pipe, KEY, tensor, size=2**20)
    files = same_host.writer(TOKEN)
    pipe.set(same_host.reference_key(KEY), files.write(tensor))
    pipe.execute()
    yield tensor, decode_chunked(client.get(KEY))
    files.remove_all()
    client.delete(*tensors.keys_of(KEY))


def reference(client):
    """(host, pid, fd, nonce, bytes) of KEY's reference."""
    return client.get(same_host.reference_key(KEY)).decode().split(":")


def refer(client, *parts):
    client.set(same_host.reference_key(KEY), ":".join(map(str, parts)))


def memfd(token, nonce, data, seals=same_host.SEALS):
    """A memfd of this process named as a writer of `token` names it, holding `data`, with `seals`."""
    fd = os.memfd_create(same_host.file_name(token, nonce), os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def test_the_file_holds_the_same_bytes_mapped_and_sealed(client, stored):
    tensor, head = stored
    read = same_host.read(client, KEY, head, TOKEN)
    assert torch.equal(read, tensor)
    read += 1   # an in-place op on the mapping changes the reader's pages only
    assert torch.equal(same_host.read(client, KEY, head, TOKEN), tensor)
    _, _, fd, _, _ = reference(client)
    with pytest.raises(PermissionError):   # sealed: never cut short under a mapping, never rewritten
        os.ftruncate(int(fd), 10)
    client.delete(tensors.chunks_key(KEY))   # only the file is left: decode with the token still finds it
    assert torch.equal(tensors.decode(client, KEY, client.get(KEY), token=TOKEN), tensor)


def test_the_chunks_are_read_where_the_file_cannot_or_must_not_be(client, stored, tmp_path):
    tensor, head = stored
    host, pid, fd, nonce, size = reference(client)
    refer(client, f"{'0' * 8}-0000-0000-0000-{'0' * 12}", pid, fd, nonce, size)
    assert same_host.read(client, KEY, head, TOKEN) is None   # another host's file
    refer(client, host, pid, fd, nonce, size)
    assert same_host.read(client, KEY, head, "another-token") is None   # another token's file
    refer(client, host, pid, fd, "0" * 32, size)
    assert same_host.read(client, KEY, head, TOKEN) is None   # another nonce
    other = tmp_path / "other"
    other.write_bytes(b"\0" * head.nbytes)
    with open(other, "rb") as unrelated:   # any other file of a process: not opened
        refer(client, host, os.getpid(), unrelated.fileno(), nonce, size)
        assert same_host.read(client, KEY, head, TOKEN) is None
    refer(client, host, 1, fd, nonce, size)   # a process of another user (or not this file)
    assert same_host.read(client, KEY, head, TOKEN) is None
    refer(client, host, pid, fd, nonce, size)
    same_host.remove_files(TOKEN)   # the requester flushed or exited
    assert same_host.read(client, KEY, head, TOKEN) is None
    assert torch.equal(tensors.decode(client, KEY, client.get(KEY), token=TOKEN), tensor)


def test_a_reference_read_already_is_followed_and_checked_as_one_read_here(client, stored):
    """A worker reads a loop's references with its inputs (worker/loops/loop_start.py) and hands them over."""
    tensor, head = stored
    given = client.get(same_host.reference_key(KEY))
    client.delete(same_host.reference_key(KEY))   # so only the given reference can lead to the file
    assert torch.equal(same_host.read(client, KEY, head, TOKEN, given), tensor)
    assert torch.equal(tensors.decode(client, KEY, client.get(KEY), token=TOKEN, reference=given), tensor)
    assert same_host.read(client, KEY, head, TOKEN, None) is None   # read, and it has none: the chunks
    with pytest.raises(WireFormatError, match="malformed same-host reference"):
        same_host.read(client, KEY, head, TOKEN, b"../../etc/passwd")


@pytest.mark.parametrize("value", ["../../etc/passwd", "/etc/passwd", "a:b", "1:2:3:4:5"])
def test_a_malformed_reference_is_refused(client, stored, value):
    _, head = stored
    client.set(same_host.reference_key(KEY), value)
    with pytest.raises(WireFormatError, match="malformed same-host reference"):
        same_host.read(client, KEY, head, TOKEN)


def test_a_size_that_does_not_match_or_an_unsealed_file_is_refused(client, stored):
    _, head = stored
    host, pid, fd, nonce, size = reference(client)
    refer(client, host, pid, fd, nonce, int(size) - 4)
    with pytest.raises(WireFormatError, match="reference declares"):
        same_host.read(client, KEY, head, TOKEN)
    for data, seals, refused in ((b"\0" * head.nbytes, 0, "not sealed"),
                                 (b"\0" * (head.nbytes // 2), same_host.SEALS, f"{head.nbytes // 2} bytes")):
        nonce = "1" * 32
        fd = memfd(TOKEN, nonce, data, seals)
        try:
            refer(client, host, os.getpid(), fd, nonce, size)
            with pytest.raises(WireFormatError, match=refused):
                same_host.read(client, KEY, head, TOKEN)
        finally:
            os.close(fd)


def test_a_requester_flush_closes_its_files(engine, monkeypatch):
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", str(2**20))
    R.Graph(name="files")
    (R.t(np.ones((1024, 1024), dtype=np.float32)) * 2).persist_op("y")
    R.activate()
    [files] = same_host._writers.values()
    [fd] = files.fds.values()
    assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:ravop-")
    R.flush()
    assert files.fds == {}


def big_graph(monkeypatch):
    """A graph of one 8 MiB constant, activated (chunks of 1 MiB and a same-host file): (X, its tensor key)."""
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", str(2**20))
    R.Graph(name="big constant")
    X = np.random.default_rng(0).random((2048, 1024), dtype=np.float32)
    (R.t(X) * 2).persist_op("y")
    R.activate()
    keys = require().keys()
    [reference_key] = require().client.keys(keys.tensor_prefix + "*:f")
    return X, reference_key.decode()[:-2]


def test_a_worker_reads_a_big_constant_from_its_file_with_the_same_result(engine, workers, monkeypatch):
    # the requester closes the file once the chunks are sent (ravop.store.background_upload), which may come before
    # the worker maps it; kept open here, as while a bigger constant's chunks are still going up
    monkeypatch.setattr(same_host, "close_file", lambda reference: None)
    workers.start(1)
    X, key = big_graph(monkeypatch)
    engine.client.delete(tensors.chunks_key(key))   # the worker can only have read the file
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    assert torch.equal(R.fetch_persisting_op("y"), torch.from_numpy(X) * 2)


def test_a_worker_survives_a_hostile_reference_on_its_queue(engine, workers, monkeypatch):
    [name] = workers.start(1)
    _, key = big_graph(monkeypatch)
    host, _, _, _, size = engine.client.get(same_host.reference_key(key)).decode().split(":")
    nonce = "2" * 32
    fd = memfd(engine.token, nonce, b"\0" * int(size), seals=0)   # an unsealed file: it could be cut short
    try:
        engine.client.set(same_host.reference_key(key), f"{host}:{os.getpid()}:{fd}:{nonce}:{size}")
        R.execute()
        with pytest.raises(GraphFailedError, match="not sealed"):
            R.track_progress(progress_bar=False, timeout=300)
    finally:
        os.close(fd)
    assert workers.alive(name)
    assert_a_valid_graph_runs()


def test_with_the_path_off_only_the_chunks_are_written(engine, monkeypatch):
    monkeypatch.setenv("RAVOP_SAME_HOST", "off")
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", str(2**20))
    R.Graph(name="off")
    (R.t(np.ones((1024, 1024), dtype=np.float32)) * 2).persist_op("y")
    R.activate()
    keys = require().keys()
    assert engine.client.keys(keys.tensor_prefix + "*:c") and not engine.client.keys(keys.tensor_prefix + "*:f")
    assert same_host._writers == {}
