"""The same-host path for big constants (ravop.store.same_host): a worker on the requester's host and user reads
them from a private file instead of the server's socket, the same bytes; every reference or file it must not
follow is refused by name, and a worker survives one on its queue. Real server and worker processes."""
import os
import stat

import numpy as np
import pytest
import torch

import ravop as R
from ravop.errors import GraphFailedError, WireFormatError
from ravop.store import same_host, tensors
from ravop.wire.codec import decode_chunked
from ravop.session import require
from tests.helpers import assert_a_valid_graph_runs

TOKEN = "same-host-test"
KEY = "ravop:same-host-test:{g}:t:1"


@pytest.fixture(autouse=True)
def private_base(tmp_path, monkeypatch):
    monkeypatch.setenv("RAVOP_SAME_HOST_DIR", str(tmp_path))
    monkeypatch.setattr(same_host, "_writers", {})
    return tmp_path


@pytest.fixture
def stored(client):
    """A chunked tensor under KEY with its same-host file: (tensor, its header, the file's path)."""
    tensor = torch.rand(512, 1024)   # 2 MiB, in 1 MiB chunks
    pipe = client.pipeline(transaction=False)
    tensors.write(pipe, KEY, tensor, size=2**20)
    files = same_host.writer(TOKEN)
    files.write(pipe, KEY, tensor)
    pipe.execute()
    head = decode_chunked(client.get(KEY))
    path = token_dir(TOKEN) / files.names[-1]
    yield tensor, head, path
    files.remove_all()
    client.delete(*tensors.keys_of(KEY))


def token_dir(token):
    return same_host.base_dir() / f"ravop-{os.getuid()}" / same_host.token_dir_name(token)


def reference(client):
    return client.get(same_host.reference_key(KEY)).decode()


def test_the_file_holds_the_same_bytes_and_is_read_instead_of_the_chunks(client, stored):
    tensor, head, path = stored
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert torch.equal(same_host.read(client, KEY, head, TOKEN), tensor)
    client.delete(tensors.chunks_key(KEY))   # only the file is left: decode with the token still finds it
    assert torch.equal(tensors.decode(client, KEY, client.get(KEY), token=TOKEN), tensor)


def test_the_chunks_are_read_where_the_file_cannot_be(client, stored):
    tensor, head, path = stored
    host, name, size = reference(client).split(":")
    client.set(same_host.reference_key(KEY), f"{'0' * 8}-0000-0000-0000-{'0' * 12}:{name}:{size}")
    assert same_host.read(client, KEY, head, TOKEN) is None   # another host's file
    client.set(same_host.reference_key(KEY), f"{host}:{name}:{size}")
    assert same_host.read(client, KEY, head, "another-token") is None   # the directory of another token
    path.unlink()   # the requester exited
    assert same_host.read(client, KEY, head, TOKEN) is None
    assert torch.equal(tensors.decode(client, KEY, client.get(KEY), token=TOKEN), tensor)


@pytest.mark.parametrize("name, refused", [
    ("../x", "not a file of the token's directory"),
    ("/etc/passwd", "not a file of the token's directory"),
    ("a:b", "malformed"),
    ("1-" + "0" * 31 + "/", "not a file of the token's directory"),
    ("..", "not a file of the token's directory"),
])
def test_a_reference_outside_the_directory_is_refused(client, stored, name, refused):
    _, head, _ = stored
    host, _, size = reference(client).split(":")
    client.set(same_host.reference_key(KEY), f"{host}:{name}:{size}")
    with pytest.raises(WireFormatError, match=refused):
        same_host.read(client, KEY, head, TOKEN)


def test_a_size_that_does_not_match_or_a_truncated_file_is_refused(client, stored):
    _, head, path = stored
    host, name, size = reference(client).split(":")
    client.set(same_host.reference_key(KEY), f"{host}:{name}:{int(size) - 4}")
    with pytest.raises(WireFormatError, match="reference declares"):
        same_host.read(client, KEY, head, TOKEN)
    client.set(same_host.reference_key(KEY), f"{host}:{name}:{size}")
    os.truncate(path, int(size) // 2)
    with pytest.raises(WireFormatError, match=f"holds {int(size) // 2} bytes"):
        same_host.read(client, KEY, head, TOKEN)


def test_a_symlink_a_fifo_or_a_directory_open_to_others_is_refused(client, stored, tmp_path):
    _, head, path = stored
    outside = tmp_path / "outside"
    outside.write_bytes(b"\0" * head.nbytes)
    path.unlink()
    path.symlink_to(outside)
    with pytest.raises(WireFormatError, match="refused"):
        same_host.read(client, KEY, head, TOKEN)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(WireFormatError, match="not a regular file"):
        same_host.read(client, KEY, head, TOKEN)
    path.unlink()
    path.write_bytes(b"\0" * head.nbytes)
    path.parent.chmod(0o755)
    with pytest.raises(WireFormatError, match="not a private directory"):
        same_host.read(client, KEY, head, TOKEN)
    path.parent.chmod(0o700)


def test_a_requester_flush_removes_its_files(engine, monkeypatch):
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", str(2**20))
    R.Graph(name="files")
    (R.t(np.ones((1024, 1024), dtype=np.float32)) * 2).persist_op("y")
    R.activate()
    directory = token_dir(engine.token)
    assert len(list(directory.iterdir())) == 1
    R.flush()
    assert list(directory.iterdir()) == []


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
    workers.start(1)
    X, key = big_graph(monkeypatch)
    engine.client.delete(tensors.chunks_key(key))   # the worker can only have read the file
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    assert torch.equal(R.fetch_persisting_op("y"), torch.from_numpy(X) * 2)


def test_a_worker_survives_a_hostile_reference_on_its_queue(engine, workers, monkeypatch):
    [name] = workers.start(1)
    _, key = big_graph(monkeypatch)
    reference = engine.client.get(same_host.reference_key(key)).decode()
    host, _, size = reference.split(":")
    engine.client.set(same_host.reference_key(key), f"{host}:../../../etc/passwd:{size}")
    R.execute()
    with pytest.raises(GraphFailedError, match="same-host reference names"):
        R.track_progress(progress_bar=False, timeout=300)
    assert workers.alive(name)
    assert_a_valid_graph_runs()
