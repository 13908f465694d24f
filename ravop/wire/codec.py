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


def _from_json(value):
    if isinstance(value, list):
        return tuple(_from_json(v) for v in value)
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
    try:
        params = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireFormatError(f"op params are not valid JSON: {exc}") from None
    if not isinstance(params, dict):
        raise WireFormatError("op params must be a JSON object")
    return {str(k): _from_json(v) for k, v in params.items()}
