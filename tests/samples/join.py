"""Samples for joining, cutting and extending tensors (ravop/ops/join.py), with numpy references."""
import numpy as np
import torch

from . import Sample
from ._numpy import f32, ints, normal, numpy


def _split(x, numOrSizeSplits, axis=0):
    return tuple(np.split(x, numOrSizeSplits, axis))


def _concat(*xs, axis=0):
    return np.concatenate(xs, axis=axis)


def _stack(*xs, axis=0):
    return np.stack(xs, axis=axis)


def _repeat(x, repeats, axis=None):
    return np.repeat(x, repeats, axis)


def _slice(x, begin, size):
    begin = (begin,) if isinstance(begin, int) else begin
    size = (size,) if isinstance(size, int) else size
    return x[tuple(slice(b, None if s == -1 else b + s) for b, s in zip(begin, size))]


def _pad(x, sequence, mode="constant", constant_values=0):
    if mode == "constant":
        return np.pad(x, sequence, mode, constant_values=constant_values)
    return np.pad(x, sequence, mode)


def _pad_backward_ref(g, sequence, mode, shape):
    """torch.autograd through numpy-checked padding (constant or index-based) gives the folded gradient."""
    x = torch.zeros(shape, dtype=g.dtype, requires_grad=True)
    with torch.enable_grad():
        if mode == "constant":
            out = torch.nn.functional.pad(x, [v for pair in reversed(sequence) for v in pair])
        else:
            index = torch.arange(int(np.prod(shape))).reshape(shape).numpy()
            picked = torch.from_numpy(np.pad(index, sequence, mode).copy())
            out = x.reshape(-1)[picked.reshape(-1)].reshape(picked.shape)
        (grad,) = torch.autograd.grad(out, x, g)
    return grad


SAMPLES = {
    "split": [
        Sample((normal(6, 2),), {"numOrSizeSplits": 3}, reference=numpy(_split), note="equal parts"),
        Sample((normal(2, 7),), {"numOrSizeSplits": (2, 5), "axis": -1}, reference=numpy(_split),
               note="split points, negative axis"),
        Sample((normal(5),), {"numOrSizeSplits": (1, 9)}, reference=numpy(_split), note="point past the end"),
    ],
    "concat": [
        Sample((normal(2, 3), normal(4, 3)), reference=numpy(_concat)),
        Sample((normal(2, 3), f32(2, 1), normal(2, 0)), {"axis": -1}, reference=numpy(_concat),
               note="three inputs, mixed dtypes, an empty one"),
        Sample((normal(2, 3), normal(4)), {"axis": None}, reference=numpy(_concat), note="axis=None flattens"),
    ],
    "stack": [
        Sample((normal(2, 3), normal(2, 3)), reference=numpy(_stack)),
        Sample((normal(2, 3), normal(2, 3), normal(2, 3)), {"axis": -1}, reference=numpy(_stack)),
    ],
    "join_to_list": [Sample((normal(2, 2), normal(3)), reference=numpy(np.append)),
                     Sample((ints(0, 3, 2), np.float64(1.5)), reference=numpy(np.append), grad=False)],
    "combine_to_list": [Sample((normal(2, 3), normal(2, 3)), reference=numpy(lambda a, b: np.array([a, b])))],
    "tile": [
        Sample((normal(2, 3),), {"reps": (2, 2)}, reference=numpy(lambda x, reps: np.tile(x, reps))),
        Sample((normal(3),), {"reps": (2, 1, 2)}, reference=numpy(lambda x, reps: np.tile(x, reps)),
               note="more reps than dims"),
        Sample((normal(2, 3, 2),), {"reps": 3}, reference=numpy(lambda x, reps: np.tile(x, reps)),
               note="fewer reps than dims"),
    ],
    "repeat": [
        Sample((normal(2, 3),), {"repeats": 2}, reference=numpy(_repeat), note="flattened"),
        Sample((normal(2, 3),), {"repeats": (1, 0, 3), "axis": 1}, reference=numpy(_repeat),
               note="per-element counts"),
        Sample((normal(3, 2),), {"repeats": 2, "axis": -2}, reference=numpy(_repeat)),
    ],
    "slice": [
        Sample((normal(5, 3),), {"begin": 1, "size": 3}, reference=numpy(_slice)),
        Sample((normal(4, 5, 2),), {"begin": (1, 2), "size": (2, -1)}, reference=numpy(_slice),
               note="per-dim, size -1"),
    ],
    "pad": [
        Sample((normal(2, 3),), {"sequence": ((1, 2), (0, 1))}, reference=numpy(_pad)),
        Sample((normal(3),), {"sequence": 2, "constant_values": 7}, reference=numpy(_pad), grad=False),
        Sample((normal(3, 4),), {"sequence": (2, 3), "mode": "edge"}, reference=numpy(_pad)),
        Sample((normal(3, 4),), {"sequence": ((5, 2), (1, 7)), "mode": "reflect"}, reference=numpy(_pad),
               note="wider than the input: reflected repeatedly"),
        Sample((normal(3, 4),), {"sequence": ((4, 2), (1, 6)), "mode": "symmetric"}, reference=numpy(_pad)),
        Sample((normal(3, 4),), {"sequence": ((2, 5), (9, 1)), "mode": "wrap"}, reference=numpy(_pad)),
        Sample((ints(0, 9, 2, 2),), {"sequence": 1}, reference=numpy(_pad), grad=False, note="ints"),
    ],
    "pad_backward": [
        Sample((normal(6, 5),), {"sequence": ((1, 2), (0, 1)), "mode": "constant", "shape": (3, 4)},
               reference=_pad_backward_ref),
        Sample((normal(10, 12),), {"sequence": ((5, 2), (1, 7)), "mode": "reflect", "shape": (3, 4)},
               reference=_pad_backward_ref),
        Sample((normal(7, 6),), {"sequence": ((2, 2), (1, 1)), "mode": "wrap", "shape": (3, 4)},
               reference=_pad_backward_ref),
    ],
}
