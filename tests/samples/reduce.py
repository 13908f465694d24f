"""Samples for the reductions (ravop/ops/reduce.py), with numpy references."""
import warnings

import numpy as np
import torch

from . import Sample
from ._numpy import f32, ints, normal, numpy


def _np(name):
    def reference(x, axis=None, keepdims=False):
        with warnings.catch_warnings():  # numpy warns about the mean of an empty slice (nan, as ours)
            warnings.simplefilter("ignore", RuntimeWarning)
            return getattr(np, name)(x, axis=axis, keepdims=keepdims)
    return numpy(reference)


def _reductions(name, nonempty=False):
    samples = [
        Sample((normal(3, 4),), reference=_np(name), note="every axis"),
        Sample((normal(2, 3, 4),), {"axis": -1}, reference=_np(name), note="negative axis"),
        Sample((normal(2, 3, 4),), {"axis": (0, 2), "keepdims": True}, reference=_np(name),
               note="several axes, keepdims"),
        Sample((f32(2, 3),), {"axis": 0}, reference=_np(name), note="float32"),
        Sample((ints(-4, 5, 3, 4),), {"axis": 1}, reference=_np(name), grad=False, note="integers"),
        Sample((normal(2, 3),), {"axis": ()}, reference=_np(name), note="axis=() reduces nothing"),
        Sample((np.float64(2.5),), reference=_np(name), note="0-d"),
    ]
    if not nonempty:
        samples.append(Sample((normal(0, 3),), {"axis": 0}, reference=_np(name), note="empty"))
    return samples


def _extreme_with_indices(values, indices):
    def reference(x, axis=None, keepdims=False, return_indices=False):
        return (getattr(np, values)(x, axis=axis, keepdims=keepdims),
                getattr(np, indices)(x, axis=axis, keepdims=keepdims))
    return numpy(reference)


def _arg(name):
    def reference(x, axis=None, keepdims=False):
        return getattr(np, name)(x, axis=axis, keepdims=keepdims)
    return numpy(reference)


def _ties_ref(x, axis=None, keepdims=False):
    return torch.amax(x, dim=axis, keepdim=keepdims)


SAMPLES = {
    "sum": _reductions("sum") + [Sample((np.array([[True, False], [True, True]]),), {"axis": 1},
                                        reference=_np("sum"), grad=False, note="bools count as int64")],
    "prod": _reductions("prod") + [
        Sample((np.array([[2.0, 0.0, 3.0], [1.5, -2.0, 0.5]]),), {"axis": 1}, reference=_np("prod"),
               note="a zero: gradient stays exact")],
    "mean": _reductions("mean") + [
        Sample((np.arange(6).reshape(2, 3),), reference=_np("mean"), grad=False, note="ints give floats")],
    "max": _reductions("max", nonempty=True) + [
        Sample((normal(3, 4),), {"axis": 1, "return_indices": True},
               reference=_extreme_with_indices("max", "argmax"), note="values and indices"),
        Sample((normal(3, 4),), {"axis": -2, "keepdims": True, "return_indices": True},
               reference=_extreme_with_indices("max", "argmax")),
        Sample((normal(3, 4),), {"return_indices": True}, reference=_extreme_with_indices("max", "argmax"),
               note="indices into the flattened input"),
        Sample((np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.5]]),), {"axis": 1}, reference=_ties_ref,
               note="ties share the gradient"),
    ],
    "min": _reductions("min", nonempty=True) + [
        Sample((normal(3, 4),), {"axis": 0, "return_indices": True},
               reference=_extreme_with_indices("min", "argmin")),
    ],
    "argmax": [
        Sample((normal(3, 4),), reference=_arg("argmax")),
        Sample((normal(3, 4),), {"axis": -1, "keepdims": True}, reference=_arg("argmax")),
        Sample((np.array([[1, 3, 3], [0, 0, 0]]),), {"axis": 1}, reference=_arg("argmax"), note="first of ties"),
    ],
    "argmin": [
        Sample((normal(3, 4),), {"axis": 0}, reference=_arg("argmin")),
        Sample((normal(3, 4),), {"keepdims": True}, reference=_arg("argmin"), note="None with keepdims"),
    ],
}
