"""foreach looks an op up by name (never eval) and applies it to each slice along axis 0."""
import numpy as np
import pytest

import ravop as R
from ravop.core.errors import ShapeError
from ravop.ops.foreach import foreach_kernel
from ravop.runtime.evaluate import evaluate

A = np.arange(24.0).reshape(2, 3, 4)


@pytest.fixture(autouse=True)
def graph():
    return R.Graph(name="foreach")


def test_foreach_passes_the_ops_own_keywords():
    out = R.foreach(R.t(A), operation="sum", axis=-1, keepdims=True)
    assert out.shape == (2, 3, 1)
    assert out.params == {"operation": "sum", "params": (("axis", -1), ("keepdims", True))}
    np.testing.assert_array_equal(evaluate(out).numpy(), A.sum(axis=-1, keepdims=True))


def test_foreach_as_a_method():
    out = R.t(A).foreach(operation="transpose")
    np.testing.assert_array_equal(evaluate(out).numpy(), np.stack([a.T for a in A]))


@pytest.mark.parametrize("operation, params, message", [
    ("__import__('os').system('id')", {}, "unknown op"),
    ("no_such_op", {}, "unknown op 'no_such_op'"),
    ("add", {}, "one tensor input"),
    ("random", {"size": 2}, "one tensor input"),
    ("split", {"numOrSizeSplits": 3}, "one output"),
])
def test_foreach_refuses_what_it_cannot_run(operation, params, message):
    with pytest.raises(ShapeError, match=message):
        R.foreach(R.t(A), operation=operation, **params)


def test_foreach_checks_the_ops_params():
    with pytest.raises(ShapeError, match="no param"):
        R.foreach(R.t(A), operation="sum", axes=0)
    with pytest.raises(ShapeError, match="needs param"):
        R.foreach(R.t(A), operation="reshape")


def test_the_kernel_looks_the_name_up_again():
    """A hostile plan reaching a worker gets the same refusal from the kernel, not an eval."""
    import torch
    with pytest.raises(ValueError, match="unknown op"):
        foreach_kernel(torch.zeros(2, 2), operation="os.system", params=())


def test_foreach_is_differentiable_through_its_kernel():
    x = R.t(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    loss = R.sum(R.foreach(x, operation="cube"))
    np.testing.assert_allclose(evaluate(R.grad(loss, x)).numpy(), 3 * evaluate(x).numpy() ** 2)
