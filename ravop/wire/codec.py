"""Bytes on the wire: tensors as a fixed header plus raw bytes, op params as JSON. Never pickle.

Tensor layout (little-endian): b"RVT1", dtype code (u8), ndim (u8), ndim x u64 dims, then the raw data.
A tensor too big for one value is stored as a chunked header, b"RVC1" with the same fields followed by the
chunk size (u64) and the number of chunks (u32), and its raw data in chunks (`ravop.store.tensors`).
Every decode checks the header against the payload, so a hostile or truncated value raises
`WireFormatError` instead of allocating what it declares.
"""
from __future__ import annotations

import json
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
import struct
from typing import Any, Optional

import numpy as np
import torch

from ..core.dtypes import DTYPES
from ..core.errors import WireFormatError

MAGIC = b"RVT1"
CHUNKED_MAGIC = b"RVC1"
MAX_NDIM = 32
MAX_CHUNKS = 2**20
_CODES = {dtype: code for code, dtype in enumerate(DTYPES.values())}
_DTYPES = list(DTYPES.values())


class Chunked:
    """What a chunked tensor's header declares: dtype, shape, the byte size of every chunk but the last,
    and how many chunks hold its `nbytes` of data."""
    __slots__ = ("dtype", "shape", "nbytes", "chunk_bytes", "n_chunks")

    def __init__(self, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int, chunk_bytes: int,
                 n_chunks: int) -> None:
        self.dtype, self.shape, self.nbytes = dtype, shape, nbytes
        self.chunk_bytes, self.n_chunks = chunk_bytes, n_chunks

    def chunk_size(self, index: int) -> int:
        return min(self.chunk_bytes, self.nbytes - index * self.chunk_bytes)


def _header(magic: bytes, tensor: torch.Tensor) -> bytes:
    if tensor.dtype not in _CODES:
        raise WireFormatError(f"cannot encode tensors of dtype {tensor.dtype}")
    if tensor.dim() > MAX_NDIM:
        raise WireFormatError(f"cannot encode a {tensor.dim()}-d tensor (at most {MAX_NDIM} dims)")
    return magic + struct.pack(f"<BB{tensor.dim()}Q", _CODES[tensor.dtype], tensor.dim(), *tensor.shape)


def raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's data as a read-only memoryview of its own memory (a copy only for a GPU tensor or a
    non-contiguous one)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.numel() == 0:
        return memoryview(b"")
    return memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy()).toreadonly()


def encode_tensor(tensor: torch.Tensor) -> bytes:
    """Header and data in one bytes object (one copy of the data)."""
    return b"".join(tensor_pieces(tensor))


def tensor_pieces(tensor: torch.Tensor) -> tuple[bytes, memoryview]:
    """What `encode_tensor` joins: its header, and the tensor's data as a view of its memory (`raw_bytes`)."""
    return _header(MAGIC, tensor), raw_bytes(tensor)


# Tensors up to this size are copied out together by `encode_tensors` when several share a dtype and shape.
_BATCHED_BYTES = 64 * 2**10


def encode_tensors(tensors: list[torch.Tensor]) -> list[bytes]:
    """`encode_tensor` of each tensor, the same bytes: small CPU tensors of one dtype and shape (a loop's
    losses) are stacked and copied out once, a tenth of the cost of one `encode_tensor` each."""
    encoded: list[Any] = [None] * len(tensors)
    groups: dict[tuple[torch.dtype, torch.Size], list[int]] = {}
    for k, tensor in enumerate(tensors):
        if tensor.is_cpu and tensor.dtype in _CODES and tensor.dim() <= MAX_NDIM and tensor.nbytes <= _BATCHED_BYTES:
            groups.setdefault((tensor.dtype, tensor.shape), []).append(k)
        else:
            encoded[k] = encode_tensor(tensor)
    for ks in groups.values():
        first = tensors[ks[0]]
        if len(ks) == 1:
            encoded[ks[0]] = encode_tensor(first)
            continue
        header, n = _header(MAGIC, first), first.nbytes
        # raw_bytes detaches the stack: a loss that requires grad needs no detach of its own
        data = bytes(raw_bytes(torch.stack([tensors[k] for k in ks])))
        for j, k in enumerate(ks):
            encoded[k] = header + data[j * n:(j + 1) * n]
    return encoded


def encode_chunked(tensor: torch.Tensor, chunk_bytes: int) -> tuple[bytes, list[memoryview]]:
    """(header, chunks) of a tensor stored in pieces of at most `chunk_bytes`: the chunks are views of the
    tensor's memory, so writing them copies nothing here."""
    data = raw_bytes(tensor)
    return chunked_header(tensor, chunk_bytes), [data[i:i + chunk_bytes] for i in range(0, len(data), chunk_bytes)]


def chunked_header(tensor: torch.Tensor, chunk_bytes: int) -> bytes:
    """The header `encode_chunked` writes for `tensor` (its data untouched)."""
    return _header(CHUNKED_MAGIC, tensor) + struct.pack("<QI", chunk_bytes, -(-tensor.nbytes // chunk_bytes))


def _parse_header(data: Any) -> tuple[torch.dtype, tuple[int, ...], int, int]:
    """(dtype, shape, byte size of the data, offset of what follows the header) of either layout."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireFormatError(f"expected tensor bytes, got {type(data).__name__}")
    if len(data) < 6 or data[:4] not in (MAGIC, CHUNKED_MAGIC):
        raise WireFormatError("not a tensor: bad magic bytes")
    code, ndim = data[4], data[5]
    if code >= len(_DTYPES) or ndim > MAX_NDIM:
        raise WireFormatError(f"not a tensor: dtype code {code}, ndim {ndim}")
    start = 6 + 8 * ndim
    if len(data) < start:
        raise WireFormatError("not a tensor: truncated header")
    shape = struct.unpack_from(f"<{ndim}Q", data, 6)
    dtype = _DTYPES[code]
    numel = 1
    for d in shape:
        numel *= d
    return dtype, shape, numel * dtype.itemsize, start


def is_chunked(data: Any) -> bool:
    return isinstance(data, (bytes, bytearray, memoryview)) and data[:4] == CHUNKED_MAGIC


def decode_chunked(data: Any) -> Chunked:
    """The `Chunked` header `encode_chunked` wrote, checked for consistency; `WireFormatError` otherwise."""
    dtype, shape, nbytes, start = _parse_header(data)
    if data[:4] != CHUNKED_MAGIC or len(data) != start + 12:
        raise WireFormatError("not a chunked tensor header")
    chunk_bytes, n_chunks = struct.unpack_from("<QI", data, start)
    if chunk_bytes == 0 or n_chunks > MAX_CHUNKS or n_chunks != -(-nbytes // chunk_bytes):
        raise WireFormatError(f"chunked tensor header declares {nbytes} bytes in {n_chunks} chunks of "
                              f"{chunk_bytes} bytes")
    return Chunked(dtype, shape, nbytes, chunk_bytes, n_chunks)


def decode_tensor(data: Any) -> torch.Tensor:
    """The tensor `encode_tensor` wrote (its own writable memory: one copy of the data); `WireFormatError`
    for anything else."""
    dtype, shape, nbytes, start = _parse_header(data)
    if data[:4] != MAGIC:
        raise WireFormatError("a chunked tensor header: its data is stored in chunks (ravop.store.tensors)")
    if nbytes != len(data) - start:
        raise WireFormatError(f"tensor header declares {tuple(shape)} {dtype} ({nbytes} bytes) but "
                              f"{len(data) - start} bytes follow")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(memoryview(data)[start:]), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def _same_layout(values: list[Any]) -> dict[tuple[bytes, int], list[int]]:
    """The positions of the plain encoded tensors among `values`, grouped by their header and size (a graph's
    losses: one group)."""
    groups: dict[tuple[bytes, int], list[int]] = {}
    for k, data in enumerate(values):
        if isinstance(data, bytes) and len(data) >= 6 and data[:4] == MAGIC and data[5] <= MAX_NDIM:
            groups.setdefault((data[:6 + 8 * data[5]], len(data)), []).append(k)
    return groups


def decode_alike(values: list[Any]) -> list[Optional[torch.Tensor]]:
    """`decode_tensor` of the values that share their header and size with another (a graph's losses), decoded
    together: views of one tensor per group, each group's header checked once (copy a view before handing it
    out, as its memory is shared); None for the others, to decode one by one (which names what is wrong)."""
    groups = _same_layout(values)
    decoded: list[Optional[torch.Tensor]] = [None] * len(values)
    for (header, _), ks in groups.items():
        if len(ks) < 2:
            continue
        try:
            first = decode_tensor(values[ks[0]])   # the same header and size: the others check out alike
        except WireFormatError:
            continue
        if first.numel() == 0:
            continue
        joined = bytearray().join(memoryview(values[k])[len(header):] for k in ks)
        stacked = torch.frombuffer(joined, dtype=torch.uint8).view(first.dtype).reshape((len(ks), *first.shape))
        for j, k in enumerate(ks):
            decoded[k] = stacked[j]
    return decoded


# Dtypes whose one value numpy reads straight from the bytes (no tensor made): a fit's 75,000 losses read in a
# third of the time.
_NUMPY_SCALARS = {torch.float32: "<f4", torch.float64: "<f8", torch.float16: "<f2", torch.int64: "<i8",
                  torch.int32: "<i4"}


def decode_scalar(data: Any) -> tuple[float, tuple[int, ...]]:
    """(the first value as a float, NaN if none; the shape) of what `encode_tensor` wrote, `WireFormatError`
    as `decode_tensor`. For one-value tensors such as losses, read in bulk."""
    dtype, shape, nbytes, start = _parse_header(data)
    layout = _NUMPY_SCALARS.get(dtype)
    if data[:4] != MAGIC or nbytes != len(data) - start or nbytes == 0 or layout is None:
        tensor = decode_tensor(data)   # the general path, which names what is wrong with the bytes
        return (float(tensor.reshape(-1)[0].real) if tensor.numel() else float("nan")), tuple(tensor.shape)
    return float(np.frombuffer(data, layout, count=1, offset=start)[0]), tuple(shape)


def decode_scalars(values: list[Any]) -> list[tuple[float, tuple[int, ...]]]:
    """`decode_scalar` of each value, those of one layout (a graph's losses: the same header and size) read by
    numpy in one call."""
    groups = _same_layout(values)
    decoded: list[Any] = [None] * len(values)
    for (header, size), ks in groups.items():
        dtype, shape, nbytes, start = _parse_header(values[ks[0]])
        layout = _NUMPY_SCALARS.get(dtype)
        if len(ks) < 2 or layout is None or nbytes == 0 or nbytes != size - start:
            continue   # one by one below: the general path names what is wrong with the bytes
        firsts = np.frombuffer(b"".join(values[k][start:start + dtype.itemsize] for k in ks), layout)
        for k, value in zip(ks, firsts.tolist()):
            decoded[k] = (float(value), shape)
    return [decode_scalar(data) if found is None else found for data, found in zip(values, decoded)]


# A plan's params come from the network: bounded so that a hostile blob gets a clear refusal, not a
# RecursionError from the JSON parser or a huge allocation. Real params (shapes, slot names, index specs)
# are a few levels deep and far smaller.
MAX_PARAMS_BYTES = 16 << 20
MAX_PARAMS_DEPTH = 32


def _from_json(value: Any, depth: int = 1) -> Any:
    if depth > MAX_PARAMS_DEPTH:
        raise WireFormatError(f"op params nest deeper than {MAX_PARAMS_DEPTH} levels")
    if isinstance(value, list):
        return tuple(_from_json(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return {k: _from_json(v, depth + 1) for k, v in value.items()}
    return value


# One encoder for every call: json.dumps with non-default options builds a new one each time, and recording a
# loop step encodes the params of every op. JSONEncoder.encode also builds its C encoder again at each call (half
# of the 1.7 us a conv2d's params took): it is built once here, with JSONEncoder's own arguments. Without the
# circular-reference check: canonical params (ravop.record.graph.canonical) are numbers, strings and fresh tuples.
_ENCODER = json.JSONEncoder(separators=(",", ":"))
_C_ENCODER = c_make_encoder and c_make_encoder(None, _ENCODER.default, encode_basestring_ascii, None, ":", ",",
                                               False, False, True)


def encode_params(params: dict[str, Any]) -> bytes:
    """JSON of an op's canonical params (tuples are written as lists and read back as tuples)."""
    if not params:
        return b""
    if _C_ENCODER is None:   # a Python without the json accelerator
        return _ENCODER.encode(params).encode()
    return "".join(_C_ENCODER(params, 0)).encode()


def decode_params(data: bytes) -> dict[str, Any]:
    if not data:
        return {}
    if len(data) > MAX_PARAMS_BYTES:
        raise WireFormatError(f"op params are {len(data):,} bytes, more than the {MAX_PARAMS_BYTES:,} allowed")
    try:
        params = json.loads(data)
    except RecursionError:
        raise WireFormatError(f"op params nest deeper than {MAX_PARAMS_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireFormatError(f"op params are not valid JSON: {exc}") from None
    if not isinstance(params, dict):
        raise WireFormatError("op params must be a JSON object")
    return {str(k): _from_json(v) for k, v in params.items()}
