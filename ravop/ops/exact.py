"""Sums and matrix products whose result does not depend on the order of their additions: the building blocks of
the reproducible numerics mode (ravop/ops/reproducible.py).

A float's bits depend on the order its additions ran in, and that order is what differs between CPUs (vector
widths, FMA), libraries (MKL's code path, oneDNN's ISA) and thread counts (how a reduction is split). Integers
add in any order to the same result, so each operand is written as integers first (the Ozaki scheme): per row
(or column) a power-of-two scale, then one or two slices of integer-valued float64 values. Slices are chosen so
that every product and every partial sum of slices stays below 2**53: float64 adds them exactly in any order, on
any BLAS and any number of threads. The exact slice results are then combined in a fixed order by elementwise
float64 operations (one IEEE rounding each, the same on every CPU) and rounded once to the result's dtype. For
k < 2**16 terms the slices keep more than float32's 24 bits below each row's (column's) largest magnitude: what
they drop is below float32's own rounding error.

Measured alternatives: slices of int8 multiplied by torch._int_mm (exact int32 sums; the int8 GEMM itself is 8x
faster than float32's here) lost to making the slices (int64 shifts over 4x the data): 1.5x slower than these
float64 products at the MNIST MLP's 128x784 @ 784x256 (docs/reports/reproducible_numerics.md).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

MANTISSA = 53          # float64 adds integers below 2**53 exactly
MAX_TERMS = 2 ** 26    # beyond this a sum's slices would be too narrow (< 13 bits) to keep float32's precision


def _bits(terms: int) -> int:
    """Bits a slice (or a product of two slices, together) may have so that `terms` of them add exactly in
    float64."""
    if terms > MAX_TERMS:
        raise ValueError(f"reproducible numerics: a sum of {terms} terms is over the exact sum's limit of "
                         f"{MAX_TERMS}")
    return MANTISSA - 1 - math.ceil(math.log2(max(terms, 2)))


def _split(x: Tensor, dim: int, bits: int, count: int = 2) -> tuple[Tensor, list[Tensor]]:
    """(scale, slices): x ~= scale * sum_t slices[t] * 2**(-bits * t), `count` slices, `scale` a power of two per
    position of the other dims (shared along `dim`, kept there with size 1), each slice integer-valued float64 of
    magnitude at most 2**bits. Every step is exact (scaling by powers of two, floor, subtraction of the floor)."""
    _, exponent = torch.frexp(x.abs().amax(dim, keepdim=True))   # |x| < 2**exponent along `dim`
    up = _pow2(bits - exponent)
    rest = x.double() * up
    slices = []
    for t in range(count):
        whole = torch.floor(rest)   # floor, not trunc: the same exactness, and torch's trunc is 10x slower
        slices.append(whole)
        if t + 1 < count:
            rest = (rest - whole) * float(2 ** bits)
    return torch.reciprocal(up), slices   # the reciprocal of a power of two: exact


def _combine(parts: Sequence[Tensor], bits: int, scale: Tensor) -> Tensor:
    """scale * sum_t parts[t] * 2**(-bits * t): a fixed order of float64 operations."""
    total = parts[-1]
    for part in reversed(parts[:-1]):
        total = part + total * 2.0 ** -bits
    return total * scale


def _pow2(exponent: Tensor) -> Tensor:
    """2.0 ** exponent in float64 made from its bits (torch.ldexp goes through pow, whose last bit may differ by
    CPU); `exponent` stays within float64's normal range for float32 operands, and for float64 ones above 2**-960."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def exact_sum(x: Tensor, dims: Sequence[int], keepdim: bool = False) -> Tensor:
    """torch.sum(x, dims, keepdim) for a floating x, the same bits on every CPU and thread count."""
    dims = sorted({d % x.dim() for d in dims}) if x.dim() else []
    if not dims:
        return x.clone()
    kept = [d for d in range(x.dim()) if d not in dims]
    terms = math.prod(x.shape[d] for d in dims)
    if not terms or not x.numel():
        return torch.sum(x, dims, keepdim)   # nothing to add: zeros (or an empty result)
    moved = x.permute(kept + dims).reshape([x.shape[d] for d in kept] + [terms])
    bits = _bits(moved.shape[-1])
    # One slice holds float32's 24 bits (and 6 more) below the row's largest magnitude up to 2**22 terms; float64
    # and longer sums take two.
    count = 1 if x.dtype in (torch.float32, torch.float16, torch.bfloat16) and bits >= 30 else 2
    scale, slices = _split(moved, -1, bits, count)
    total = _combine([s.sum(-1, keepdim=True) for s in slices], bits, scale).to(x.dtype)
    shape = [1 if d in dims else n for d, n in enumerate(x.shape)] if keepdim else [x.shape[d] for d in kept]
    return total.reshape(shape)


def exact_mean(x: Tensor, dims: Sequence[int], keepdim: bool = False) -> Tensor:
    count = math.prod(x.shape[d] for d in dims) if x.dim() else 1
    return exact_sum(x, dims, keepdim) / count


def exact_matmul(a: Tensor, b: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """torch.matmul(a, b) for floating a and b (batched and broadcast as torch's), the same bits on every CPU,
    BLAS and thread count. a's rows in two slices of b1 bits, b's columns in one of b2 bits (b1 + b2 + log2(k) <= 52,
    b2 ~ 2 * b1: both cover 2/3 of float64's bits below their largest magnitude), one float64 product of the stacked
    slices of a with b's, exact, and the two halves combined in a fixed order. `dtype`: the result's (default: a's
    and b's promoted), float64 for one that more additions follow."""
    squeeze_a, squeeze_b = a.dim() == 1, b.dim() == 1
    if squeeze_a:
        a = a.unsqueeze(0)
    if squeeze_b:
        b = b.unsqueeze(-1)
    m, k = a.shape[-2:]
    if b.shape[-2] != k:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not chain")
    if not k or not a.numel() or not b.numel():
        out = torch.matmul(a, b) if dtype is None else torch.matmul(a, b).to(dtype)   # nothing to add: zeros
    else:
        bits = _bits(k)
        bits_a = bits // 3
        bits_b = bits - bits_a
        scale_a, (a_hi, a_lo) = _split(a, -1, bits_a, 2)
        scale_b, (b_one,) = _split(b, -2, bits_b, 1)
        high, low = torch.matmul(torch.cat((a_hi, a_lo), -2), b_one).split(m, -2)
        out = _combine([high, low], bits_a, scale_a) * scale_b
        out = out.to(torch.promote_types(a.dtype, b.dtype) if dtype is None else dtype)
    if squeeze_a:
        out = out.squeeze(-2)
    if squeeze_b:
        out = out.squeeze(-1)
    return out
