"""Samples for the dimension-rearranging ops (ravop/ops/shape.py) and core's broadcast_to/sum_to."""
import numpy as np

from . import Sample
from ._numpy import ints, normal, numpy


def _flatten(x, start_dim=0, end_dim=-1):
    start, end = start_dim % max(x.ndim, 1), end_dim % max(x.ndim, 1)
    return x.reshape(x.shape[:start] + (-1,) + x.shape[end + 1:]) if x.ndim else x.reshape(1)


def _sum_to(x, shape):
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True)


SAMPLES = {
    "transpose": [
        Sample((normal(2, 3, 4),), reference=numpy(np.transpose), note="axes=None reverses"),
        Sample((normal(2, 3, 4),), {"axes": (1, -1, 0)}, reference=numpy(lambda x, axes: np.transpose(x, axes)),
               note="negative axis in a permutation"),
        Sample((np.float64(3.0),), reference=numpy(np.transpose), note="0-d"),
    ],
    "reshape": [
        Sample((normal(2, 6),), {"shape": (3, -1)}, reference=numpy(lambda x, shape: x.reshape(shape))),
        Sample((normal(2, 3),), {"shape": 6}, reference=numpy(lambda x, shape: x.reshape(shape)), note="int"),
        Sample((normal(0, 3),), {"shape": (3, 0)}, reference=numpy(lambda x, shape: x.reshape(shape)),
               note="empty"),
        Sample((ints(0, 5, 4),), {"shape": (2, 1, 2)}, reference=numpy(lambda x, shape: x.reshape(shape)),
               grad=False),
    ],
    "expand_dims": [
        Sample((normal(2, 3),), reference=numpy(lambda x, axis=0: np.expand_dims(x, axis))),
        Sample((normal(2, 3),), {"axis": (0, -1)}, reference=numpy(lambda x, axis: np.expand_dims(x, axis)),
               note="several axes, negative"),
    ],
    "squeeze": [
        Sample((normal(1, 3, 1),), reference=numpy(lambda x, axis=None: np.squeeze(x, axis))),
        Sample((normal(1, 3, 1),), {"axis": -1}, reference=numpy(lambda x, axis: np.squeeze(x, axis))),
    ],
    "flatten": [
        Sample((normal(2, 3, 4),), reference=numpy(_flatten)),
        Sample((normal(2, 3, 4, 5),), {"start_dim": 1, "end_dim": -2}, reference=numpy(_flatten),
               note="torch-style start/end"),
        Sample((np.float64(1.0),), reference=numpy(_flatten), note="0-d gives (1,)"),
    ],
    "ravel": [
        Sample((normal(2, 3),), reference=numpy(lambda x, order="C": np.ravel(x, order))),
        Sample((normal(2, 3, 4),), {"order": "F"}, reference=numpy(lambda x, order: np.ravel(x, order)),
               note="column-major"),
    ],
    "reverse": [
        Sample((normal(2, 3),), reference=numpy(lambda x, axis=None: np.flip(x, axis))),
        Sample((normal(2, 3, 4),), {"axis": (0, -1)}, reference=numpy(lambda x, axis: np.flip(x, axis))),
    ],
    "shape": [
        Sample((normal(2, 3, 4),), reference=numpy(lambda x, index=None: np.array(x.shape))),
        Sample((normal(2, 3, 4),), {"index": -1}, reference=numpy(lambda x, index: np.array(x.shape[index]))),
    ],
    "size": [Sample((normal(2, 3, 4),), reference=numpy(np.size)),
             Sample((normal(0, 3),), reference=numpy(np.size), note="empty")],
    "ravint": [Sample((np.array([-2.7, -0.5, 0.5, 3.9]),), reference=numpy(lambda x: x.astype(np.int64)),
                      note="truncates toward zero")],
    "broadcast_to": [Sample((normal(3, 1),), {"shape": (2, 3, 4)},
                            reference=numpy(lambda x, shape: np.broadcast_to(x, shape)))],
    "sum_to": [Sample((normal(2, 3, 4),), {"shape": (3, 1)}, reference=numpy(_sum_to))],
}
