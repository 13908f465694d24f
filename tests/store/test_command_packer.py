"""The clients' command packer (ravop.store.command_packer): hiredis for commands of small values, redis-py's
pure-Python packer (large values and buffers sent from their own memory) for the rest, the same bytes on the
wire either way, the same errors for what redis-py refuses; and a real server reads what it packs. A `Joined`
value (a tensor's header and its memory) is one value on the wire, its pieces sent as they are."""
import numpy as np
import pytest
import torch
from redis.connection import Encoder, PythonRespSerializer
from redis.exceptions import DataError

from ravop.store import connect
from ravop.store import tensors
from ravop.store.command_packer import BUFFER_CUTOFF, CommandPacker, Joined
from ravop.wire.codec import decode_tensor, encode_tensor, tensor_pieces

PURE = PythonRespSerializer(BUFFER_CUTOFF, Encoder("utf-8", "strict", False).encode)


def wire(pieces):
    return b"".join(bytes(piece) for piece in pieces)


@pytest.mark.parametrize("args", [
    ("UNLINK", *(f"ravop:t:{{t.g}}:t:{i}" for i in range(600))),
    ("CONFIG GET", "proto-max-bulk-len"),
    (b"CONFIG GET", b"maxmemory"),
    ("HSET", "k", "f", 1.5, "g", -0.0, "h", 1e-300, "i", 2**70, "j", -3, "k", float("inf"), "l", 0.1 + 0.2),
    ("SET", "k", "é ü 中", "EX", 10),
    ("SET", "k", b""),
    ("SET", "k", b"x" * BUFFER_CUTOFF),
])
def test_small_commands_are_packed_by_hiredis_into_the_same_bytes(args):
    pieces = CommandPacker().pack(*args)
    assert len(pieces) == 1 and type(pieces[0]) is bytes
    assert pieces[0] == wire(PURE.pack(*args))


def test_a_large_value_or_a_buffer_is_sent_from_its_own_memory():
    big = b"x" * (BUFFER_CUTOFF + 1)
    view = memoryview(np.arange(10, dtype=np.float32))
    for value in (big, view):
        pieces = CommandPacker().pack("SET", "k", value)
        assert any(piece is value for piece in pieces)   # not copied into the packed command
        assert wire(pieces) == wire(PURE.pack("SET", "k", value))


@pytest.mark.parametrize("command", [("SET", "k"), ("HSET", "ravop:c", 7), ("CONFIG SET", "x")])
def test_a_joined_value_is_one_value_whose_pieces_are_sent_from_their_own_memory(command):
    tensor = torch.arange(5000, dtype=torch.float32)
    header, data = tensor_pieces(tensor)
    pieces = CommandPacker().pack(*command, Joined(header, data), "EX", 10)
    assert any(piece is data for piece in pieces)   # the tensor's memory, not a copy of it
    assert wire(pieces) == wire(PURE.pack(*command, encode_tensor(tensor), "EX", 10))


@pytest.mark.parametrize("value", [np.float64(1.5), bytearray(b"ab")])
def test_other_types_are_packed_as_redis_py_packs_them(value):
    assert wire(CommandPacker().pack("SET", "k", value)) == wire(PURE.pack("SET", "k", value))


@pytest.mark.parametrize("value", [True, np.int64(3), None, object(), [1]])
def test_what_redis_py_refuses_is_refused_the_same_way(value):
    with pytest.raises(DataError) as ours:
        CommandPacker().pack("SET", "k", value)
    with pytest.raises(DataError) as theirs:
        PURE.pack("SET", "k", value)
    assert str(ours.value) == str(theirs.value)


def test_a_server_reads_what_it_packs(server):
    client = connect(server.url)
    try:
        tensor = torch.arange(5000, dtype=torch.float32)
        keys = [f"packer:{i}" for i in range(300)]
        pipe = client.pipeline(transaction=False)
        for i, key in enumerate(keys):
            pipe.set(key, i)
        pipe.set("packer:big", encode_tensor(tensor))
        pipe.hset("packer:h", mapping={"float": 0.1, "text": "é"})
        pipe.execute()
        with client.pipeline(transaction=True) as multi:   # written without a copy of the tensor, in a MULTI
            plus = tensor + 1
            assert tensors.write(multi, "packer:joined", plus) == len(encode_tensor(tensor))
            value = multi.command_stack[-1][0][-1]
            assert type(value) is Joined and np.frombuffer(value.pieces[1], np.uint8).ctypes.data == plus.data_ptr()
            multi.execute()
        assert [int(v) for v in client.mget(keys)] == list(range(300))
        assert torch.equal(decode_tensor(client.get("packer:big")), tensor)
        assert torch.equal(decode_tensor(client.get("packer:joined")), plus)
        assert client.hgetall("packer:h") == {b"float": b"0.1", b"text": "é".encode()}
        assert client.unlink(*keys, "packer:big", "packer:joined", "packer:h") == 303
    finally:
        client.close()
