"""Where a value lies in memory must not change its bits. MKL's sgemm (under linear, matmul, convolution and a
TorchScript model's layers) rounds differently when its data does not start on a 16-byte boundary: a micro-batch
sliced out of a batch (rows 6..11 of 5 floats: a view 120 bytes in) and the same rows uploaded on their own gave
other losses (issue 40: a resident Pipeline against its segments). Tensors that torch allocates, that the wire
decodes and that numpy allocates start on such a boundary; a view at an offset need not, so the ops that hand out
views of their input at an offset (index, split, slice, pad's VJP, the federated releases) return `aligned` values,
the view itself where it is aligned and a copy where it is not, and constants made from a slice of an array are
read aligned (tests/core/test_value_alignment.py walks the registry for ops that do not)."""
import torch

ALIGNMENT = 16   # bytes; MKL 2024.2 gives the bits of 64-byte aligned data at 16, 32 and 48 bytes, not at 4, 8, 12


def aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it that starts on an `ALIGNMENT`-byte boundary when it does not."""
    if t.data_ptr() % ALIGNMENT == 0 or not t.numel():
        return t
    return t.clone(memory_format=torch.contiguous_format)
