"""REFERENCE.md section 4's KNN-style and linear-regression-style scripts, written only with ravop ops, equal
the same maths in numpy, evaluated in-process and run through the real engine (the `execute` fixture).

`record_knn` and `record_linear_regression` take the data and return the ops to fetch."""
import numpy as np
import pytest
import torch

import ravop as R


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


# ------------------------------------------------------------------------------------- linear regression

def record_linear_regression(X, y, alpha=0.1, iterations=30):
    """Gradient descent theta <- theta - (alpha / m) X^T (X theta - y), then the R^2 score, with the
    original script's ops: dot sub div multiply transpose, and sum square sub mean div."""
    m = X.shape[0]
    X_op, y_op = R.t(X), R.t(y)
    theta = R.t(np.zeros((X.shape[1], 1)))
    step = R.div(R.t(np.float64(alpha)), R.t(np.float64(m)))
    for _ in range(iterations):
        error = R.sub(R.dot(X_op, theta), y_op)
        theta = R.sub(theta, R.multiply(step, R.dot(R.transpose(X_op), error)))
    prediction = R.dot(X_op, theta)
    ss_res = R.sum(R.square(R.sub(y_op, prediction)))
    ss_tot = R.sum(R.square(R.sub(y_op, R.mean(y_op))))
    return {"theta": theta, "r2": R.sub(R.t(np.float64(1.0)), R.div(ss_res, ss_tot))}


def numpy_linear_regression(X, y, alpha=0.1, iterations=30):
    theta = np.zeros((X.shape[1], 1))
    for _ in range(iterations):
        theta = theta - (alpha / X.shape[0]) * X.T @ (X @ theta - y)
    prediction = X @ theta
    return {"theta": theta, "r2": 1.0 - ((y - prediction) ** 2).sum() / ((y - y.mean()) ** 2).sum()}


def regression_data(m=200, n=3, seed=0):
    rng = np.random.default_rng(seed)
    X = np.hstack([np.ones((m, 1)), rng.normal(size=(m, n))])
    y = X @ rng.normal(size=(n + 1, 1)) + 0.1 * rng.normal(size=(m, 1))
    return X, y


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
    X, y = regression_data()
    got = _run(execute, record_linear_regression(X, y))
    want = numpy_linear_regression(X, y)
    assert got["theta"].dtype == torch.float64
    np.testing.assert_allclose(got["theta"].numpy(), want["theta"], rtol=1e-12, atol=1e-14)
    assert got["r2"].item() == pytest.approx(want["r2"], rel=1e-12)
    assert want["r2"] > 0.9
