"""Samples for sort, argsort and unique (ravop/ops/sorting.py), with numpy references."""
import numpy as np

from . import Sample
from ._numpy import ints, normal, numpy


def _sort(x, axis=-1, return_indices=False):
    order = np.argsort(x, axis=axis, kind="stable")
    values = np.sort(x, axis=axis, kind="stable")
    return (values, order) if return_indices else values


def _argsort(x, axis=-1):
    return np.argsort(x, axis=axis, kind="stable")


def _unique(x, return_inverse=False, return_counts=False, axis=None):
    out = np.unique(x, return_inverse=return_inverse, return_counts=return_counts, axis=axis)
    if not isinstance(out, tuple):
        return out
    if return_inverse and axis is None:
        out = (out[0], out[1].reshape(x.shape)) + out[2:]
    return out


SAMPLES = {
    "sort": [
        Sample((normal(3, 4),), reference=numpy(_sort)),
        Sample((normal(3, 4),), {"axis": 0, "return_indices": True}, reference=numpy(_sort),
               note="values and indices"),
        Sample((normal(2, 3),), {"axis": None}, reference=numpy(_sort), note="flattened"),
        Sample((ints(0, 3, 8),), reference=numpy(_sort), grad=False, note="ints with ties: stable"),
    ],
    "argsort": [Sample((normal(3, 4),), reference=numpy(_argsort)),
                Sample((np.array([3, 1, 3, 1, 2]),), reference=numpy(_argsort), note="stable on ties")],
    "unique": [
        Sample((np.array([[3, 1, 2], [1, 3, 3]]),), reference=numpy(_unique)),
        Sample((np.array([[3, 1, 2], [1, 3, 3]]),), {"return_inverse": True, "return_counts": True},
               reference=numpy(_unique), note="three outputs"),
        Sample((np.array([[1.0, 2.0], [0.0, 5.0], [1.0, 2.0]]),), {"axis": 0, "return_counts": True},
               reference=numpy(_unique), note="unique rows"),
        Sample((np.zeros(0),), reference=numpy(_unique), note="empty"),
    ],
}
