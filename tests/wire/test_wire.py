"""The wire format: tensors as header + raw bytes, params as JSON, the protobuf plan, and the committed
generated code matching its .proto."""
import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from google.protobuf.message import DecodeError

from ravop.core.dtypes import DTYPES
from ravop.core.errors import PlanError, WireFormatError
from ravop.core.node import Node
from ravop.wire import (decode_params, decode_tensor, encode_params, encode_tensor, encode_tensors, pack_nodes,
                        plan_pb2, unpack_nodes)
from ravop.wire.codec import MAGIC, decode_alike, decode_scalar, decode_scalars

WIRE = Path(__file__).resolve().parents[2] / "ravop" / "wire"


def sample(dtype, shape):
    values = torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape) - 3.5
    if dtype == torch.bool:
        return values > 0
    if dtype.is_complex:
        return torch.complex(values, -values).to(dtype)
    return values.to(dtype)


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (7,), (2, 3, 4)], ids=str)
def test_tensor_round_trip_is_exact(dtype, shape):
    tensor = sample(dtype, shape)
    back = decode_tensor(encode_tensor(tensor))
    assert back.dtype == dtype and tuple(back.shape) == shape
    assert torch.equal(back, tensor)


def test_non_contiguous_and_bfloat16_bits_survive():
    t = torch.randn(4, 6, dtype=torch.float64).to(torch.bfloat16).t()[1:3]  # a strided view
    back = decode_tensor(encode_tensor(t))
    assert torch.equal(back.view(torch.int16), t.contiguous().view(torch.int16))
    data = encode_tensor(torch.tensor([1.0, 2.0]))
    assert data[:4] == MAGIC and len(data) == 4 + 2 + 8 + 2 * 4  # header, one dim, 8 bytes of floats


def test_decoded_tensor_is_writable_and_independent_of_the_buffer():
    data = bytearray(encode_tensor(torch.tensor([1, 2, 3])))
    t = decode_tensor(data)
    data[-8:] = b"\xff" * 8
    t += 1
    assert t.tolist() == [2, 3, 4]


def header(code, shape):
    return MAGIC + struct.pack(f"<BB{len(shape)}Q", code, len(shape), *shape)


@pytest.mark.parametrize("data, message", [
    (b"", "bad magic"),
    (b"PICKLE\x80\x04", "bad magic"),
    (b"RVT1\x08", "bad magic"),                                   # shorter than the fixed header
    (header(8, (3,))[:-3], "truncated header"),
    (header(8, (3,)) + b"\x00" * 11, "12 bytes"),                  # one byte short of 3 float32
    (header(8, (3,)) + b"\x00" * 13, "12 bytes"),                  # one byte too many
    (header(200, (3,)), "dtype code 200"),
    (MAGIC + bytes([8, 200]), "ndim 200"),
    (header(8, (1 << 40, 1 << 20)), "bytes follow"),              # declares 4 PiB: refused, not allocated
    (header(11, (2 ** 64 - 1,) * 2) + b"\x00" * 64, "bytes follow"),
])
def test_hostile_bytes_raise_wire_format_error_quickly(data, message):
    start = time.perf_counter()
    with pytest.raises(WireFormatError, match=message):
        decode_tensor(data)
    assert time.perf_counter() - start < 0.1


def test_non_bytes_are_refused():
    with pytest.raises(WireFormatError, match="expected tensor bytes"):
        decode_tensor("RVT1")


def test_params_json_round_trip_keeps_types():
    params = {"axis": (0, -1), "keepdims": True, "p": 0.5, "n": 3, "name": "relu", "none": None,
              "nested": ((1, 2), (3.0, "x")), "big": 2 ** 62, "neg": -1e-300}
    back = decode_params(encode_params(params))
    assert back == params
    assert [type(back[k]) for k in params] == [type(v) for v in params.values()]
    assert encode_params({}) == b"" and decode_params(b"") == {}
    assert encode_params({"x": 1}) != encode_params({"x": 1.0}) != encode_params({"x": True})


@pytest.mark.parametrize("params", [{"stride": (1, 1), "padding": "same", "groups": 1},
                                    {"p": float("nan"), "q": float("inf"), "r": -0.0, "s": 1e-300, "t": 0.1 + 0.2},
                                    {"name": "é\u2028\"x\"", "flag": False, "none": None, "deep": ((1, (2, (3,))),)}])
def test_params_are_the_json_that_json_dumps_writes(params):
    assert encode_params(params) == json.dumps(params, separators=(",", ":")).encode()


def test_params_that_are_not_json_are_refused_as_json_refuses_them():
    with pytest.raises(TypeError, match="Object of type dtype is not JSON serializable"):
        encode_params({"dtype": torch.float32})


@pytest.mark.parametrize("data", [b"{", b"\xff\xfe", b"[1, 2]", b"__import__('os')"])
def test_bad_params_raise_wire_format_error(data):
    with pytest.raises(WireFormatError):
        decode_params(data)


def test_plan_round_trip():
    plan = plan_pb2.Plan(graph_id="abc", seed=2 ** 63 + 5, n_recorded_ops=10, n_compiled_ops=4, flops=1.5e9,
                         max_parallel_width=2)
    plan.persisted["loss"] = 7
    plan.constants.extend([0, 1])
    sub = plan.subgraphs.add(id=0, inputs=[0, 1], outputs=[7], successors=[1], device="cuda", flops=1e9, bytes=64)
    pack_nodes([Node(2, "split", [0], pkey=encode_params({"numOrSizeSplits": 2}), source="a.py:3"),
                Node(3, "tuple_get", [2], pkey=encode_params({"index": 0}), shape=[2, -1], dtype=torch.float32,
                     source="a.py:3"),
                Node(4, "add", [3, 1], shape=[], dtype=torch.int64)], sub.nodes)
    plan.subgraphs.add(id=1, n_predecessors=1)
    back = plan_pb2.Plan.FromString(plan.SerializeToString())
    assert back == plan
    assert back.seed == 2 ** 63 + 5 and dict(back.persisted) == {"loss": 7}
    split, get, add = unpack_nodes(back.subgraphs[0].nodes)
    assert (split.id, split.op, split.inputs, split.shape, split.dtype, split.source) == (2, "split", [0], (), None,
                                                                                          "a.py:3")
    assert (get.inputs, get.shape, get.dtype, get.params) == ([2], (2, -1), torch.float32, {"index": 0})
    assert get.pkey == encode_params({"index": 0})
    assert (add.inputs, add.shape, add.dtype, add.params, add.pkey, add.source) == ([3, 1], (), torch.int64, {}, b"",
                                                                                    "")
    assert unpack_nodes(back.subgraphs[1].nodes) == []


@pytest.mark.parametrize("damage, message", [
    (lambda nodes: nodes.op.append("neg"), "column lengths {'op': 3}"),
    (lambda nodes: nodes.source.pop(), "column lengths {'source': 1}"),
    (lambda nodes: nodes.inputs.append(9), "declare 2 inputs in all but list 3"),
    (lambda nodes: nodes.n_inputs.__setitem__(1, 10**9), "declare 1000000001 inputs"),
    (lambda nodes: nodes.shape.pop(), "declare 1 shape dimensions in all but list 0"),
])
def test_node_columns_that_do_not_fit_together_are_refused(damage, message):
    sub = plan_pb2.Subgraph()
    pack_nodes([Node(2, "neg", [1], shape=[4], dtype=torch.float32), Node(3, "neg", [2])], sub.nodes)
    damage(sub.nodes)
    with pytest.raises(PlanError, match=re.escape(message)):
        unpack_nodes(plan_pb2.Subgraph.FromString(sub.SerializeToString()).nodes)


def test_garbage_plan_bytes_raise_a_decode_error():
    with pytest.raises(DecodeError):
        plan_pb2.Plan.FromString(b"\x1a\xff\xff\xff\xff\x0f")


def test_regenerating_plan_pb2_changes_nothing(tmp_path):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{WIRE}", f"--python_out={tmp_path}",
                    str(WIRE / "plan.proto")], check=True, capture_output=True)
    assert (tmp_path / "plan_pb2.py").read_bytes() == (WIRE / "plan_pb2.py").read_bytes(), \
        "ravop/wire/plan_pb2.py is stale: run scripts/gen_proto.sh"


def test_tensors_encoded_together_give_each_ones_own_bytes():
    tensors = [torch.tensor(1.5), torch.tensor(-2.0), sample(torch.float32, (2, 3)), sample(torch.float32, (2, 3)).t(),
               torch.zeros(0, 2), torch.zeros(0, 2), torch.tensor([True, False]), torch.tensor([False, True]),
               torch.tensor(3.0, dtype=torch.bfloat16), torch.tensor(4.0, dtype=torch.bfloat16),
               torch.arange(100_000, dtype=torch.float32), torch.tensor(7, dtype=torch.int64),
               torch.tensor(1.0, requires_grad=True), torch.tensor(2.0, requires_grad=True) * 3]
    assert encode_tensors(tensors) == [encode_tensor(t) for t in tensors]
    assert encode_tensors([]) == []


def test_values_decoded_alike_equal_their_own_decoding_and_odd_ones_are_left_alone():
    tensors = [torch.tensor(0.25), torch.tensor(float("nan")), torch.tensor(-0.0), sample(torch.float64, (2, 2)),
               sample(torch.float64, (2, 2)), sample(torch.int32, (3,)), torch.zeros(0), torch.zeros(0)]
    values = [encode_tensor(t) for t in tensors] + [b"not a tensor", MAGIC + bytes([0, 0]) + b"\x00" * 3,
                                                    MAGIC + bytes([0, 0]) + b"\x00" * 3]
    decoded = decode_alike(values)
    for data, tensor in zip(values, decoded[:5]):   # the three scalars, the two 2x2 tensors: bit for bit
        assert tensor is not None and tensor.clone().numpy().tobytes() == decode_tensor(data).numpy().tobytes()
        assert tensor.dtype == decode_tensor(data).dtype and tensor.shape == decode_tensor(data).shape
    # alone in its layout, empty, or malformed (two alike but too short: their header checked once, refused)
    assert decoded[5:] == [None] * 6


def test_scalars_decoded_together_equal_their_own_decoding():
    tensors = [torch.tensor(0.1), torch.tensor(float("inf")), torch.tensor(3, dtype=torch.int64),
               torch.tensor(4, dtype=torch.int64), torch.tensor([1.5, 2.0]), torch.tensor([2.5, 3.0]),
               torch.tensor(1.0, dtype=torch.float16), torch.tensor(2.0, dtype=torch.float16), torch.tensor(True),
               torch.tensor(0.2, dtype=torch.float64)]
    values = [encode_tensor(t) for t in tensors]
    together = decode_scalars(values)
    assert together == [decode_scalar(v) for v in values]
    assert all(type(value) is float for value, _ in together)
    with pytest.raises(WireFormatError):
        decode_scalars(values + [b"not a tensor"])
