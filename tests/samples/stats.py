"""Samples for the statistics ops (ravop/ops/stats.py), with numpy references."""
import numpy as np

from . import Sample
from ._numpy import f32, ints, normal, numpy

positive = np.abs(normal(3, 4)) + 0.1


def _average(x, weights=None, axis=None, keepdims=False):
    return np.average(x, axis=axis, weights=weights, keepdims=keepdims)


def _spread(name):
    def reference(x, axis=None, ddof=0, keepdims=False):
        return getattr(np, name)(x, axis=axis, ddof=ddof, keepdims=keepdims)
    return numpy(reference)


def _percentile(x, q, axis=None, keepdims=False, method="linear"):
    return np.percentile(x, q, axis=axis, keepdims=keepdims, method=method)


def _median(x, axis=None, keepdims=False):
    return np.median(x, axis=axis, keepdims=keepdims)


def _mode(x, axis=0, keepdims=None):
    """The most frequent value, the smallest on ties (scipy.stats.mode), by counting; keepdims=None keeps
    the axis of 1-d input only (the original's shape (1,))."""
    keepdims = x.ndim == 1 if keepdims is None else keepdims
    if axis is None:
        x, axis = x.reshape(-1), 0
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1], dtype=x.dtype)
    for index in np.ndindex(out.shape):
        values, counts = np.unique(moved[index], return_counts=True)
        out[index] = values[np.argmax(counts)]
    return np.expand_dims(out, axis) if keepdims else out


def _bincount(x, weights=None, minlength=0):
    return np.bincount(x, weights=weights, minlength=minlength)


def _spreads(name):
    return [
        Sample((normal(3, 4),), reference=_spread(name)),
        Sample((normal(2, 3, 4),), {"axis": (0, -1), "ddof": 1, "keepdims": True}, reference=_spread(name),
               note="several axes, ddof, keepdims"),
        Sample((f32(5, 2),), {"axis": 0}, reference=_spread(name), note="float32"),
        Sample((ints(0, 9, 6),), reference=_spread(name), grad=False, note="ints give floats"),
    ]


SAMPLES = {
    "average": [
        Sample((normal(3, 4),), {"axis": 1}, reference=numpy(_average), note="no weights: the mean"),
        Sample((normal(3, 4), positive), reference=numpy(_average), note="full weights"),
        Sample((normal(3, 4), positive[0]), {"axis": -1, "keepdims": True}, reference=numpy(_average),
               note="1-D weights along an axis"),
        Sample((ints(0, 5, 4), ints(1, 3, 4)), reference=numpy(_average), grad=False, note="ints"),
    ],
    "variance": _spreads("var"),
    "std": _spreads("std"),
    "percentile": [
        Sample((normal(5, 4),), {"q": 30}, reference=numpy(_percentile)),
        Sample((normal(5, 4),), {"q": (10, 50, 95), "axis": 0, "keepdims": True}, reference=numpy(_percentile),
               note="several q: their dim comes first"),
        Sample((normal(3, 4, 5),), {"q": 75, "axis": (0, 2)}, reference=numpy(_percentile), note="two axes"),
        Sample((normal(2, 7),), {"q": 40, "axis": 1, "method": "nearest"}, reference=numpy(_percentile),
               grad=False),
        Sample((normal(2, 7),), {"q": 40, "axis": 1, "method": "lower"}, reference=numpy(_percentile)),
        Sample((normal(2, 7),), {"q": 40, "axis": 1, "method": "higher"}, reference=numpy(_percentile)),
        Sample((normal(2, 6),), {"q": 50, "axis": 1, "method": "midpoint"}, reference=numpy(_percentile)),
        Sample((ints(0, 20, 9),), {"q": 25}, reference=numpy(_percentile), grad=False, note="ints"),
    ],
    "median": [
        Sample((normal(4, 5),), reference=numpy(_median), note="even count: mean of the middle two"),
        Sample((normal(3, 5),), {"axis": -1, "keepdims": True}, reference=numpy(_median)),
        Sample((ints(0, 9, 7),), reference=numpy(_median), grad=False, note="ints give floats"),
    ],
    "mode": [
        Sample((np.array([[1, 2, 2], [3, 3, 1], [1, 3, 2], [1, 0, 0]]),), reference=numpy(_mode), grad=False),
        Sample((np.array([[3, 1, 3, 1, 2], [5, 5, 4, 4, 4]]),), {"axis": 1, "keepdims": True},
               reference=numpy(_mode), grad=False, note="ties: the smallest"),
        Sample((np.array([[0.5, 1.5, 0.5], [2.0, 2.0, 1.0]]),), {"axis": None}, reference=numpy(_mode),
               note="flattened; the gradient goes to one occurrence"),
        Sample((np.array([2, 0, 2, 1]),), reference=numpy(_mode), grad=False, note="1-d: shape (1,), as the original"),
    ],
    "bincount": [
        Sample((np.array([0, 1, 1, 3, 1]),), reference=numpy(_bincount), grad=False),
        Sample((np.array([0, 1, 1, 3]), normal(4)), {"minlength": 6}, reference=numpy(_bincount),
               note="weights and minlength"),
        Sample((np.zeros(0, dtype=np.int64),), reference=numpy(_bincount), grad=False, note="empty"),
    ],
}
