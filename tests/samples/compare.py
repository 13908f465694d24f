"""Samples for comparisons, logic and where (ravop/ops/compare.py), with numpy references."""
import numpy as np

from . import Sample
from ._numpy import f32, ints, normal, numpy

a = ints(0, 3, 3, 4)


def _compare(fn):
    return [
        Sample((a, ints(0, 3, 3, 4)), reference=numpy(fn)),
        Sample((normal(3, 1), f32(4)), reference=numpy(fn), note="broadcast, mixed dtypes"),
        Sample((a, np.int64(1)), reference=numpy(fn), note="0-d operand"),
        Sample((normal(0, 2), normal(2)), reference=numpy(fn), note="empty"),
    ]


def _where(condition, x, y):
    return np.where(condition, x, y)


SAMPLES = {
    "greater": _compare(np.greater),
    "greater_equal": _compare(np.greater_equal),
    "less": _compare(np.less),
    "less_equal": _compare(np.less_equal),
    "equal": _compare(np.equal),
    "not_equal": _compare(np.not_equal),
    "logical_and": _compare(np.logical_and),
    "logical_or": _compare(np.logical_or),
    "logical_xor": _compare(np.logical_xor),
    "logical_not": [Sample((a,), reference=numpy(np.logical_not)),
                    Sample((np.array([True, False]),), reference=numpy(np.logical_not))],
    "where": [
        Sample((normal(3, 4) > 0, normal(3, 4), normal(3, 4)), reference=numpy(_where)),
        Sample((normal(3, 1) > 0, normal(4), np.float64(0.0)), reference=numpy(_where), note="broadcasting"),
        Sample((ints(0, 2, 5), ints(0, 9, 5), f32(5)), reference=numpy(_where), grad=False,
               note="int condition, promoted result"),
    ],
}
