"""The original Ravop's KNN-style and linear-regression-style example scripts, written only with ravop ops, equal
the same maths in numpy, evaluated in-process and run through the real engine (the `execute` fixture).

`record_knn` and the example's `record` (examples/linear_regression.py) take the data and return the ops
to fetch."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ravop as R

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import linear_regression  # noqa: E402


# ------------------------------------------------------------------------------------------------- KNN

def record_knn(X_train, y_train, X_test, y_test, k):
    """k-nearest-neighbour classification: Euclidean distances, the k nearest labels, their mode."""
    train, labels, test = R.t(X_train), R.t(y_train), R.t(X_test)
    differences = R.sub(R.expand_dims(test, axis=1), R.expand_dims(train, axis=0))    # (m, n, d)
    distances = R.square_root(R.sum(R.square(differences), axis=2))                   # (m, n)
    _, order = R.sort(distances, axis=1, return_indices=True)
    nearest = order[:, :k]                                                              # (m, k)
    votes = R.gather(labels, nearest)                                                   # (m, k) labels
    prediction = R.mode(votes, axis=1)                                                  # (m,)
    accuracy = R.mean(R.equal(prediction, R.t(y_test)))
    return {"distances": distances, "prediction": prediction, "accuracy": accuracy}


def numpy_knn(X_train, y_train, X_test, y_test, k):
    distances = np.sqrt(((X_test[:, None, :] - X_train[None, :, :]) ** 2).sum(axis=2))
    nearest = np.argsort(distances, axis=1, kind="stable")[:, :k]
    votes = y_train[nearest]
    prediction = np.array([np.bincount(row).argmax() for row in votes])  # most votes, smallest label on ties
    return {"distances": distances, "prediction": prediction, "accuracy": (prediction == y_test).mean()}


def knn_data(seed=0):
    """Three Gaussian blobs, 60 points to learn from and 30 to classify."""
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [3.0, 3.0], [-3.0, 2.5]])
    labels = rng.integers(0, 3, size=90)
    points = centres[labels] + rng.normal(scale=1.2, size=(90, 2))
    return points[:60], labels[:60], points[60:], labels[60:]


# ------------------------------------------------------------------------------------------------ tests

def _run(execute, ops):
    names = list(ops)
    return dict(zip(names, execute([ops[name] for name in names])))


def test_knn_script_equals_numpy(execute):
    R.Graph(name="knn", algorithm="knn")
    data = knn_data()
    got = _run(execute, record_knn(*data, k=5))
    want = numpy_knn(*data, k=5)
    np.testing.assert_allclose(got["distances"].numpy(), want["distances"], rtol=1e-12)
    np.testing.assert_array_equal(got["prediction"].numpy(), want["prediction"])
    assert got["accuracy"].item() == pytest.approx(want["accuracy"])
    assert want["accuracy"] > 0.8  # the data is learnable, so a wrong neighbour search would show


def test_linear_regression_script_equals_numpy(execute):
    R.Graph(name="linear_regression", algorithm="linear_regression")
    X, y = linear_regression.make_data()
    got = _run(execute, linear_regression.record(X, y, iterations=30))
    theta, r2 = linear_regression.numpy_reference(X, y, iterations=30)
    want = {"theta": theta, "r2": r2}
    assert got["theta"].dtype == torch.float64
    np.testing.assert_allclose(got["theta"].numpy(), want["theta"], rtol=1e-12, atol=1e-14)
    assert got["r2"].item() == pytest.approx(want["r2"], rel=1e-12)
    assert want["r2"] > 0.9
