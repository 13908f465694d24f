"""FLOP rules shared by several ops, for the compiler's cost model: an op names its rule in its registry entry
(`register(..., flops=rule)`); `rule(shape, input_shapes, params)` estimates the floating-point operations from
the op's output shape, its inputs' shapes and its params. An op without a rule costs the size of the largest
tensor it touches (elementwise ops and reductions). Unknown (-1) dimensions count as 1."""
import math

from ..core.sizes import numel_estimate


def matmul(shape, ins, params):
    x = ins[0]
    return 2.0 * numel_estimate(shape) * (x[-1] if x else 1)


def contraction(shape, ins, params):
    """dot/tensordot: the contracted size c satisfies numel(x) * numel(y) = numel(out) * c**2."""
    out = max(numel_estimate(shape), 1)
    return 2.0 * out * math.sqrt(numel_estimate(ins[0]) * numel_estimate(ins[1]) / out)


def linear(shape, ins, params):
    return 2.0 * numel_estimate(shape) * (ins[1][-1] if ins[1] else 1)


def linear_backward(shape, ins, params):
    g, x, w = ins[:3]   # grad input and grad weight: each a matmul as big as the forward
    return 4.0 * numel_estimate(g) * (w[-1] if w else 1)


def conv2d(shape, ins, params):
    w = ins[1]
    return 2.0 * numel_estimate(shape) * numel_estimate(w[1:])  # w: (out_c, in_c / groups, kh, kw)


def conv2d_backward(shape, ins, params):
    g, x, w = ins[:3]
    return 4.0 * numel_estimate(g) * numel_estimate(w[1:])


def inverse(shape, ins, params):
    return float(numel_estimate(shape)) * (shape[-1] if shape else 1)  # n**3 per matrix


def sort(shape, ins, params):
    n = max(numel_estimate(ins[0]), 2)
    return n * math.log2(n)
