"""Samples for index, index_backward and set_value (ravop/ops/indexing.py), with numpy references.

Each sample is written as the Python index a user would write; `canonical_index` turns it into the op's
`spec` param and tensor inputs, and numpy applies the same index to make the reference."""
import numpy as np

from ravop.record.index_spec import canonical_index

from . import Sample
from ._numpy import ints, normal

x = normal(4, 5, 6)
mask = normal(4, 5) > 0


def _index(x, index, note="", grad=True):
    spec, tensors = canonical_index(index)
    return Sample((x, *tensors), {"spec": spec}, reference=lambda *_, spec: np.array(x[index]), grad=grad,
                  note=note)


def _backward(g, index, shape, note=""):
    spec, tensors = canonical_index(index)

    def reference(*_, spec, shape):
        out = np.zeros(shape)
        np.add.at(out, index, g)
        return out
    return Sample((g, *tensors), {"spec": spec, "shape": shape}, reference=reference, note=note)


def _set(x, value, index, note="", grad=True):
    spec, tensors = canonical_index(index)

    def reference(*_, spec):
        out = x.copy()
        out[index] = value
        return out
    return Sample((x, value, *tensors), {"spec": spec}, reference=reference, grad=grad, note=note)


SAMPLES = {
    "index": [
        _index(x, 1, note="an int"),
        _index(x, (slice(1, 3), -1), note="slice and negative int"),
        _index(x, (Ellipsis, None, slice(None, None, 2)), note="ellipsis, new axis, step"),
        _index(x, (slice(None, None, -1), slice(4, 0, -2)), note="negative steps"),
        _index(x, ([0, 2, 2], slice(None), [1, 0, 1]), note="separated arrays and duplicates: dims go first"),
        _index(x, (0, slice(None), [1, 2]), note="an int among arrays counts as an array (numpy)"),
        _index(x, (slice(None), np.array([[0, 1], [2, 3]])), note="a 2-d tensor index"),
        _index(x, mask, note="a bool tensor mask: data-dependent size"),
        _index(x, (slice(None), [True, False, True, False, True]), note="a bool list"),
        _index(x, (slice(2, 2),), note="empty slice"),
        _index(ints(0, 9, 3, 4), (slice(None), -1), grad=False, note="ints"),
    ],
    "index_backward": [
        _backward(normal(2, 6), (slice(1, 3), -1), (4, 5, 6)),
        _backward(normal(3, 5), ([0, 2, 2], slice(None), [1, 0, 1]), (4, 5, 6), note="repeats accumulate"),
        _backward(normal(3, 5, 3), (slice(None, None, -1), slice(None), slice(None, None, 2)), (3, 5, 6),
                  note="negative and positive steps"),
    ],
    "set_value": [
        _set(normal(4, 5), normal(5), 1, note="a row, broadcast value"),
        _set(normal(4, 5), np.float64(0.5), (slice(None), [0, 3]), note="a 0-d value into columns"),
        _set(normal(4, 5), normal(2, 2), (slice(None, None, -2), slice(1, 3)), note="negative step"),
        _set(ints(0, 9, 3, 3), np.int64(-1), (slice(None), 0), grad=False, note="ints"),
    ],
}
