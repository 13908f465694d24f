"""Bytes on the wire: tensors as a fixed header plus raw bytes, op params as JSON. Never pickle.

Tensor layout (little-endian): b"RVT1", dtype code (u8), ndim (u8), ndim x u64 dims, then the raw data.
Every decode checks the header against the payload, so a hostile or truncated value raises
`WireFormatError` instead of allocating what it declares.
"""
import json
import struct

import torch

from ..dtypes import DTYPES
from ..errors import WireFormatError

MAGIC = b"RVT1"
MAX_NDIM = 32
_CODES = {dtype: code for code, dtype in enumerate(DTYPES.values())}
_DTYPES = list(DTYPES.values())


def encode_tensor(tensor):
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype not in _CODES:
        raise WireFormatError(f"cannot encode tensors of dtype {tensor.dtype}")
    if tensor.dim() > MAX_NDIM:
        raise WireFormatError(f"cannot encode a {tensor.dim()}-d tensor (at most {MAX_NDIM} dims)")
    header = MAGIC + struct.pack(f"<BB{tensor.dim()}Q", _CODES[tensor.dtype], tensor.dim(), *tensor.shape)
    if tensor.numel() == 0:
        return header
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return header + data


def decode_tensor(data):
    """The tensor `encode_tensor` wrote; `WireFormatError` for anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireFormatError(f"expected tensor bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < 6 or data[:4] != MAGIC:
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
    itemsize = torch.empty((), dtype=dtype).element_size()
    if numel * itemsize != len(data) - start:
        raise WireFormatError(f"tensor header declares {tuple(shape)} {dtype} ({numel * itemsize} bytes) but "
                              f"{len(data) - start} bytes follow")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(data[start:]), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


# A plan's params come from the network: bounded so that a hostile blob gets a clear refusal, not a
# RecursionError from the JSON parser or a huge allocation. Real params (shapes, slot names, index specs)
# are a few levels deep and far smaller.
MAX_PARAMS_BYTES = 16 << 20
MAX_PARAMS_DEPTH = 32


def _from_json(value, depth=1):
    if depth > MAX_PARAMS_DEPTH:
        raise WireFormatError(f"op params nest deeper than {MAX_PARAMS_DEPTH} levels")
    if isinstance(value, list):
        return tuple(_from_json(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return {k: _from_json(v, depth + 1) for k, v in value.items()}
    return value


# One encoder for every call: json.dumps with non-default options builds a new one each time, and compiling
# a graph encodes the params of every node.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode_params(params):
    """JSON of an op's canonical params (tuples are written as lists and read back as tuples)."""
    if not params:
        return b""
    return _ENCODER.encode(params).encode()


def decode_params(data):
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
