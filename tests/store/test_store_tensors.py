"""Big tensors in the store: chunked writes and reads (exact, released like any value), hostile chunk
headers, and the server's limits checked before anything is written. The chunk size is lowered
($RAVOP_CHUNK_BYTES, inherited by the workers started here) so that the tensors stay small."""
import struct

import pytest
import torch

import ravop as R
from ravop.core.errors import StoreLimitError, WireFormatError
from ravop.store import GraphKeys, background_upload, tensors
from ravop.wire.codec import decode_chunked, encode_chunked

CHUNK = 1000


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", str(CHUNK))


def store(client, key, tensor, size=None):
    pipe = client.pipeline(transaction=False)
    queued = tensors.write(pipe, key, tensor, size)
    pipe.execute()
    return queued


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8,
                                   torch.bool, torch.complex64])
def test_chunked_round_trip_is_exact(client, small_chunks, dtype):
    tensor = (torch.rand(37, 29) * 100).to(dtype)
    key = f"test:chunked:{dtype}"
    store(client, key, tensor)
    assert client.hlen(tensors.chunks_key(key)) > 1  # really chunked
    back = tensors.read(client, key)
    assert back.dtype == dtype and back.shape == tensor.shape and torch.equal(back, tensor)
    back += 1 if dtype != torch.bool else True  # its own memory, writable
    client.delete(*tensors.keys_of(key))


def test_a_rewrite_replaces_the_chunks(client, small_chunks):
    key = "test:chunked:rewrite"
    store(client, key, torch.arange(1000, dtype=torch.float64))
    store(client, key, torch.arange(300, dtype=torch.float64))
    assert client.hlen(tensors.chunks_key(key)) == 3
    assert torch.equal(tensors.read(client, key), torch.arange(300, dtype=torch.float64))
    client.delete(*tensors.keys_of(key))


def test_small_tensors_stay_one_value(client, small_chunks):
    store(client, "test:small", torch.ones(10))
    assert not client.exists(tensors.chunks_key("test:small"))
    assert torch.equal(tensors.read(client, "test:small"), torch.ones(10))
    client.delete("test:small")


def test_deleted_chunks_read_as_missing(client, small_chunks):
    key = "test:chunked:gone"
    store(client, key, torch.rand(2000))
    client.delete(tensors.chunks_key(key))
    assert tensors.read(client, key) is None


def test_hostile_chunk_header_is_refused_before_allocating(client, small_chunks):
    header, _ = encode_chunked(torch.zeros(10), 8)
    huge = header[:-20] + struct.pack("<Q", 2**40) + struct.pack("<QI", 2**30, 4096)  # a 4 TiB float tensor
    client.set("test:hostile", huge)
    client.hset(tensors.chunks_key("test:hostile"), 0, b"x")
    with pytest.raises(WireFormatError, match="declares 4096 chunks of 1073741824 bytes .* but 1 are stored"):
        tensors.read(client, "test:hostile")   # one HLEN, before any HSTRLEN or allocation
    with pytest.raises(WireFormatError, match=r"\(4,194,304.0 MiB\), over this reader's memory budget of 1.0 MiB"):
        tensors.decode(client, "test:hostile", client.get("test:hostile"), max_bytes=2**20)
    client.hset(tensors.chunks_key("test:hostile"), mapping={i: b"x" for i in range(4096)})
    with pytest.raises(WireFormatError, match="do not match its header"):
        tensors.read(client, "test:hostile")
    with pytest.raises(WireFormatError, match="declares"):
        decode_chunked(header[:-4] + struct.pack("<I", 7))  # wrong chunk count for the size
    client.delete(*tensors.keys_of("test:hostile"))


def test_chunk_size_follows_the_server_limit(client):
    """A server whose proto-max-bulk-len is below the chunk size gets smaller chunks, not an error."""
    old = client.config_get("proto-max-bulk-len")["proto-max-bulk-len"]
    client.config_set("proto-max-bulk-len", 2**20)
    try:
        size = tensors.fit_to_server(client, 0)
        assert size < 2**20
        tensor = torch.rand(2**19)  # 2 MiB
        store(client, "test:bulk", tensor, size)
        assert client.hlen(tensors.chunks_key("test:bulk")) == 3
        assert torch.equal(tensors.read(client, "test:bulk"), tensor)
    finally:
        client.config_set("proto-max-bulk-len", old)
        client.delete(*tensors.keys_of("test:bulk"))


def test_round_trip_through_a_worker_in_chunks(engine, small_chunks, workers):
    """R.t(x) * 2 + 1: the constant is uploaded in chunks, the worker reads it and writes its output in
    chunks, the requester fetches it exactly; the consumed input is deleted with its chunks."""
    workers.start(1)
    x = torch.rand(5000)
    R.Graph(name="big")
    const = R.t(x)
    (const * 2 + 1).persist_op("y")
    R.activate()
    background_upload.finish(engine.token)   # a big constant's chunks go up after activate (on a thread)
    keys = GraphKeys(engine.token, engine.graph_id)
    assert engine.client.hlen(tensors.chunks_key(keys.tensor(const.id))) == 20
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    assert torch.equal(R.fetch_persisting_op("y"), x * 2 + 1)
    assert not engine.client.exists(*tensors.keys_of(keys.tensor(const.id)))


def test_graph_over_maxmemory_fails_before_writing(engine):
    client = engine.client
    old = client.config_get("maxmemory")["maxmemory"]
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 4 * 2**20)
    try:
        R.Graph(name="too-big")
        (R.t(torch.zeros(2**21)) + 1).persist_op("y")  # 8 MiB
        with pytest.raises(StoreLimitError, match=r"the graph's constants need 8\.0 MiB .* maxmemory"):
            R.activate()
    finally:
        client.config_set("maxmemory", old)
    assert not list(client.scan_iter(match=f"ravop:{engine.token}:*"))  # nothing written
