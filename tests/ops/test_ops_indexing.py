"""Indexing semantics beyond the registry walk: the string parser (and what it refuses), x[...] with tensors,
set_value, and record-time errors naming the user's line."""
import numpy as np
import pytest
import torch

import ravop as R
from ravop.core.errors import ShapeError
from ravop.record.index_spec import canonical_index, parse_index
from ravop.runtime.evaluate import evaluate

X = np.arange(60.0).reshape(3, 4, 5)


@pytest.fixture(autouse=True)
def graph():
    return R.Graph(name="indexing")


@pytest.mark.parametrize("text, index", [
    ("[:,-1,:]", (slice(None), -1, slice(None))),
    ("[1:3, 0]", (slice(1, 3), 0)),
    ("[0]", 0),
    ("[0,]", (0,)),
    ("[::-2, ..., None]", (slice(None, None, -2), Ellipsis, None)),
    ("[ 1 : : 2 ]", slice(1, None, 2)),
    ("[[0, 2], :, [True, False, True, False, False]]", ([0, 2], slice(None), [True, False, True, False, False])),
    ("[[[0], [1]], -1]", ([[0], [1]], -1)),
])
def test_string_index_parses_like_python(text, index):
    assert parse_index(text) == index
    np.testing.assert_array_equal(evaluate(R.t(X)[text]).numpy(), X[index])


@pytest.mark.parametrize("text", [
    "__import__('os').system('echo hacked')",
    "[__import__('os')]",
    "[0]; import os",
    "[1+1]",
    "[x]",
    "[0](1)",
    "[0",
    "0]",
    "[]",
    "[1:2:3:4]",
    "[0] [1]",
    "[" * 100 + "]" * 100,
    "[" + "0," * 5000 + "]",
])
def test_hostile_or_malformed_strings_are_refused(text):
    with pytest.raises(ValueError, match="index string"):
        parse_index(text)


def test_refused_string_names_the_offending_text():
    with pytest.raises(ValueError, match="unexpected") as info:
        R.t(X)["[__import__('os')]"]
    assert "__import__('os')" in str(info.value)


def test_index_records_canonical_json_params():
    op = R.t(X)[1:3, None, ..., [0, 2]]
    assert op.op == "index"
    assert op.params == {"spec": (("s", 1, 3, None), ("n",), ("e",), ("l", (0, 2)))}
    assert op.shape == (2, 1, 4, 2)


def test_tensor_indices_become_inputs():
    x = R.t(X)
    rows = R.t([2, 0, 1, 1])
    cols = R.argmax(R.sum(x, axis=0), axis=1)  # an index computed in the graph
    out = x[rows, :, cols]
    assert out.inputs[1:] == (rows, cols)
    want = X[[2, 0, 1, 1], :, X.sum(axis=0).argmax(axis=1)]
    np.testing.assert_array_equal(evaluate(out).numpy(), want)


def test_numpy_and_torch_arrays_as_indices():
    x = R.t(X)
    np.testing.assert_array_equal(evaluate(x[np.array([1, 1])]).numpy(), X[[1, 1]])
    np.testing.assert_array_equal(evaluate(x[:, torch.tensor([True, False, True, False])]).numpy(),
                                  X[:, [True, False, True, False]])


def test_bool_mask_gives_an_unknown_dimension():
    x = R.t(X)
    picked = x[x > 30.0]
    assert picked.shape == (-1,)
    doubled = picked * 2.0 + R.t(1.0)  # -1 broadcasts with known sizes
    assert doubled.shape == (-1,)
    np.testing.assert_array_equal(evaluate(doubled).numpy(), X[X > 30] * 2 + 1)


def test_index_method_and_function_forms():
    x = R.t(X)
    np.testing.assert_array_equal(evaluate(R.index(x, indices="[:, 1]")).numpy(), X[:, 1])
    np.testing.assert_array_equal(evaluate(x.index((0, slice(None, 2)))).numpy(), X[0, :2])


@pytest.mark.parametrize("index, message", [
    ((0, 0, 0, 0), "too many indices"),
    ((slice(None), 4), "index 4 is out of bounds for axis 1 of size 4"),
    (([0, 3],), "index 3 is out of bounds for axis 0 of size 3"),
    ((Ellipsis, Ellipsis), "single ellipsis"),
    ((slice(0, 2, 0),), "step cannot be zero"),
    ((1.5,), "cannot index with 1.5"),
])
def test_bad_indices_raise_when_recorded(index, message):
    with pytest.raises((ShapeError, IndexError, ValueError, TypeError), match=message):
        R.t(X)[index]


def test_record_time_error_names_the_user_line():
    x = R.t(X)
    with pytest.raises(ShapeError) as info:
        x[:, 7]  # the line the error must name
    assert f"{__file__}:" in str(info.value) and "index" in str(info.value)


def test_float_tensor_index_is_refused():
    with pytest.raises(ShapeError, match="integer or bool"):
        R.t(X)[R.t([0.0, 1.0])]


def test_set_value_returns_a_new_tensor():
    x = R.t(X)
    y = R.set_value(x, R.t(-1.0), "[:, 0, ::2]")
    want = X.copy()
    want[:, 0, ::2] = -1.0
    got_y, got_x = evaluate([y, x])
    np.testing.assert_array_equal(got_y.numpy(), want)
    np.testing.assert_array_equal(got_x.numpy(), X)  # the input is not modified


def test_set_value_checks_the_value_shape():
    with pytest.raises(ShapeError, match="cannot be assigned"):
        R.set_value(R.t(X), R.t(np.ones(7)), (0,))


def test_index_gradient_accumulates_repeats():
    x = R.t(np.arange(4.0))
    loss = R.sum(x[[0, 0, 3]] * R.t([1.0, 2.0, 5.0]))
    np.testing.assert_array_equal(evaluate(R.grad(loss, x)).numpy(), [3.0, 0.0, 0.0, 5.0])


def test_canonical_index_rejects_bool_scalars_and_ragged_lists():
    with pytest.raises(TypeError):
        canonical_index(True)
    with pytest.raises(TypeError, match="rectangular"):
        canonical_index([[0, 1], [2]])
