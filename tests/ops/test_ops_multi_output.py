"""Ops with several outputs return a tuple of handles; their VJPs get one gradient per output."""
import numpy as np
import pytest

import ravop as R
from ravop.runtime.evaluate import evaluate

A = np.array([[3.0, 1.0, 2.0, 0.5], [0.0, 4.0, 1.5, 2.5], [2.0, 2.2, 9.0, 1.0]])


@pytest.fixture(autouse=True)
def graph():
    return R.Graph(name="multi")


def test_split_returns_one_handle_per_part():
    parts = R.split(R.t(A), 2, axis=1)
    assert isinstance(parts, tuple) and len(parts) == 2
    assert [p.shape for p in parts] == [(3, 2), (3, 2)]
    for got, want in zip(evaluate(list(parts)), np.split(A, 2, axis=1)):
        np.testing.assert_array_equal(got.numpy(), want)


def test_the_graph_owns_a_multi_output_ops_outputs():
    parts = R.split(R.t(A), 2, axis=1)
    node = parts[0].inputs[0]
    assert node.output(0) is parts[0] and node.output(1) is parts[1]
    with pytest.raises(TypeError, match="single output"):
        parts[0].output(0)
    # A max-pool VJP reads the forward's own indices output instead of recording another handle on it.
    x = R.t(np.arange(16.0).reshape(1, 1, 4, 4))
    values, indices = R.max_pool2d(x, kernel_size=2, return_indices=True)
    n_before = len(x.graph.nodes)
    R.grad(R.sum(values), x)
    backward = next(op for op in x.graph.nodes[n_before:] if op.op == "max_pool2d_indices_backward")
    assert backward.inputs[2] is indices


def test_sort_values_only_by_default_and_indices_on_request():
    x = R.t(A)
    assert not isinstance(R.sort(x), tuple)
    values, indices = R.sort(x, axis=0, return_indices=True)
    got_values, got_indices = evaluate([values, indices])
    np.testing.assert_array_equal(got_values.numpy(), np.sort(A, axis=0))
    np.testing.assert_array_equal(got_indices.numpy(), np.argsort(A, axis=0, kind="stable"))


def test_max_and_min_with_indices():
    x = R.t(A)
    values, indices = x.max(axis=1, return_indices=True)
    assert values.shape == indices.shape == (3,)
    np.testing.assert_array_equal(evaluate(indices).numpy(), A.argmax(axis=1))
    low, where = R.min(x, return_indices=True)
    assert low.shape == where.shape == ()
    assert evaluate(where).item() == A.argmin()


def test_unique_with_inverse_and_counts():
    data = np.array([3, 1, 3, 2, 1, 3])
    values, inverse, counts = R.unique(R.t(data), return_inverse=True, return_counts=True)
    assert values.shape == (-1,) and counts.shape == (-1,) and inverse.shape == (6,)
    want = np.unique(data, return_inverse=True, return_counts=True)
    for got, expected in zip(evaluate([values, inverse, counts]), want):
        np.testing.assert_array_equal(got.numpy(), expected)
    np.testing.assert_array_equal(evaluate(R.gather(values, inverse)).numpy(), data)


def test_gradient_through_one_output_of_split():
    x = R.t(A)
    top, _ = R.split(x, (1,), axis=0)  # the unused part's gradient slot is None: zeros come back
    grad = evaluate(R.grad(R.sum(R.square(top)), x)).numpy()
    want = np.zeros_like(A)
    want[0] = 2 * A[0]
    np.testing.assert_array_equal(grad, want)


def test_gradient_of_max_values_goes_to_the_returned_index():
    x = R.t(A)
    values, indices = R.max(x, axis=0, return_indices=True)
    grad = evaluate(R.grad(R.sum(values), x)).numpy()
    want = np.zeros_like(A)
    want[A.argmax(axis=0), np.arange(4)] = 1.0
    np.testing.assert_array_equal(grad, want)


def test_a_multi_output_node_cannot_be_persisted_but_its_outputs_can():
    parts = R.split(R.t(A), 3)
    node = parts[0].inputs[0]
    with pytest.raises(ValueError, match="multi-output"):
        node.persist_op("all_parts")
    parts[1].persist_op("middle_row")
