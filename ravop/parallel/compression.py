"""How a pseudo-gradient (and the update sent back) travels, as ops: compressed to a narrow dtype, the error of
the compression fed back into the next round (error feedback, as 1-bit SGD and DiLoCo's successors keep it),
so nothing is lost over rounds, only delayed.

- 'fp16': the tensor clipped to float16's range and cast to float16 (2 bytes a value);
- 'int8': per tensor, scale = max|x| / 127 (1 where x is all zeros), q = clip(round(x / scale), -127, 127) cast
  to int8 (1 byte a value, plus the float32 scale); the receiver reads q * scale.
Ravnest's `compression=True` casts the tensors it sends to float16: it is 'fp16' here."""

FP16_MAX = 65504.0
KINDS = ("fp16", "int8")


def check_compression(compression):
    """None, 'fp16' or 'int8' from the knob (Ravnest's True is 'fp16', False None)."""
    if compression is True:
        return "fp16"
    if compression is False or compression is None:
        return None
    if compression not in KINDS:
        raise ValueError(f"compression must be None, 'fp16', 'int8' (or Ravnest's True: 'fp16'), not {compression!r}")
    return compression


def compress(x, kind):
    """What crosses the network for float32 `x`: (values in the narrow dtype, scale Op or None)."""
    if kind == "fp16":
        return x.clip(-FP16_MAX, FP16_MAX).cast("float16"), None
    scale = x.abs().max() * (1.0 / 127.0)
    scale = scale + scale.equal(0.0).cast("float32")   # all zeros: any scale gives q = 0
    return (x / scale).round().clip(-127.0, 127.0).cast("int8"), scale


def decompress(values, scale):
    """The float32 tensor the receiver reads."""
    values = values.cast("float32")
    return values if scale is None else values * scale


def send(x, residual, kind):
    """(what the receiver reads, the residual to feed back next time) of sending `x` with error feedback:
    the sender compresses x + residual (x alone the first time, `residual` None) and keeps what was lost."""
    true = x if residual is None else x + residual
    received = decompress(*compress(true, kind))
    return received, true - received
