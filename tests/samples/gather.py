"""Samples for gather, take_along_axis, one_hot_encoding, find_indices and their backward ops
(ravop/ops/gather.py), with numpy references."""
import numpy as np

from . import Sample
from ._numpy import ints, normal, numpy


def _find_indices(x, values):
    rows = [np.flatnonzero(x.reshape(-1) == v) for v in values.reshape(-1)]
    width = max((len(r) for r in rows), default=0)
    return np.array([np.pad(r, (0, width - len(r)), constant_values=-1) for r in rows], dtype=np.int64)


def _take(x, indices, axis=0):
    return np.take(x, indices, axis=axis)


def _gather_backward_ref(g, indices, axis=0, shape=None):
    out = np.zeros(shape)
    if axis is None:
        np.add.at(out.reshape(-1), indices.reshape(-1), g.reshape(-1))
        return out
    a = axis % len(shape)
    moved = np.moveaxis(g, tuple(range(a, a + indices.ndim)), tuple(range(indices.ndim)))
    target = np.moveaxis(out, a, 0)
    np.add.at(target, indices, moved)
    return out


def _along_backward_ref(g, indices, axis, size):
    shape = list(g.shape)
    shape[axis] = size
    out = np.zeros(shape)
    indices = np.broadcast_to(indices, g.shape) % size
    for pos in np.ndindex(g.shape):
        target = list(pos)
        target[axis] = indices[pos]
        out[tuple(target)] += g[pos]
    return out


def _one_hot(x, depth):
    rows = np.eye(depth)[x.reshape(-1)]
    return rows if x.ndim else rows.reshape(depth)


SAMPLES = {
    "gather": [
        Sample((normal(5, 3), np.array([4, 0, 0, -1])), reference=numpy(_take), note="repeats, negative"),
        Sample((normal(2, 5, 3), np.array([[1, 2], [3, 1]])), {"axis": 1}, reference=numpy(_take),
               note="2-d indices on a middle axis"),
        Sample((normal(3, 4), np.array([11, 0, 5])), {"axis": None}, reference=numpy(_take), note="flattened"),
    ],
    "gather_backward": [
        Sample((normal(2, 2, 2, 3), np.array([[1, 2], [4, 1]])), {"axis": 1, "shape": (2, 5, 3)},
               reference=numpy(_gather_backward_ref)),
        Sample((normal(3), np.array([11, 0, 11])), {"axis": None, "shape": (3, 4)},
               reference=numpy(_gather_backward_ref)),
    ],
    "take_along_axis": [
        Sample((normal(3, 4), np.argsort(normal(3, 4), axis=1)), {"axis": 1},
               reference=numpy(lambda x, i, axis: np.take_along_axis(x, i, axis))),
        Sample((normal(3, 4), np.array([[0, 3, 3]]).T), {"axis": -1},
               reference=numpy(lambda x, i, axis: np.take_along_axis(x, i, axis)), note="repeats"),
        Sample((normal(1, 4), np.array([[0, 1], [2, 3], [1, 1]])), {"axis": 1},
               reference=numpy(lambda x, i, axis: np.take_along_axis(x, i, axis)), note="x broadcast"),
    ],
    "take_along_axis_backward": [
        Sample((normal(3, 2), np.array([[0, 3], [3, 3], [1, 2]])), {"axis": 1, "size": 4},
               reference=numpy(_along_backward_ref)),
    ],
    "step_row": [
        Sample((normal(5, 3),), {"row": 3}, reference=numpy(lambda table, row: table[row]), grad=False),
        Sample((ints(0, 9, 4, 2, 2),), {"row": 0}, reference=numpy(lambda table, row: table[row]), grad=False,
               note="the first row of a 3-d integer table"),
    ],
    "one_hot_encoding": [
        Sample((np.array([0, 2, 1, 2]),), {"depth": 3}, reference=numpy(_one_hot)),
        Sample((np.array([[1], [0]]),), {"depth": 4}, reference=numpy(_one_hot), note="(n, 1) labels"),
        Sample((np.int64(2),), {"depth": 3}, reference=numpy(_one_hot), note="0-d label"),
    ],
    "find_indices": [
        Sample((np.array([[3, 1, 2], [1, 5, 3]]), np.array([1, 3])), reference=numpy(_find_indices),
               note="one row per value"),
        Sample((np.array([4, 1, 4, 4, 2]), np.array([4, 2])), reference=numpy(_find_indices),
               note="rows padded with -1 to the most matches"),
        Sample((ints(0, 3, 6), np.array([7])), reference=numpy(_find_indices), note="no match: empty row"),
    ],
}
