"""Linear regression by raw ops, as the original Ravop example script wrote it (dot, sub, div, multiply,
transpose): gradient descent on theta, then the R^2 score from sum, square, sub, mean and div.

    theta <- theta - (alpha / m) * X^T (X theta - y)
"""
import os

import numpy as np

import ravop as R

ITERATIONS = int(os.environ.get("RAVOP_EXAMPLE_ITERATIONS", "50"))


def make_data(m=200, n=3, seed=0):
    rng = np.random.default_rng(seed)
    X = np.hstack([np.ones((m, 1)), rng.normal(size=(m, n))])
    true_theta = rng.normal(size=(n + 1, 1))
    y = X @ true_theta + 0.1 * rng.normal(size=(m, 1))
    return X, y


def record(X, y, alpha=0.1, iterations=ITERATIONS):
    """The ops of theta after `iterations` steps and of the R^2 score: {"theta": Op, "r2": Op}."""
    m = X.shape[0]
    X_op, y_op = R.t(X), R.t(y)
    theta = R.t(np.zeros((X.shape[1], 1)))
    step = R.div(R.t(np.float64(alpha)), R.t(np.float64(m)))  # numpy scalars keep float64 (Python floats: float32)
    for _ in range(iterations):
        error = R.sub(R.dot(X_op, theta), y_op)
        theta = R.sub(theta, R.multiply(step, R.dot(R.transpose(X_op), error)))
    prediction = R.dot(X_op, theta)
    ss_res = R.sum(R.square(R.sub(y_op, prediction)))
    ss_tot = R.sum(R.square(R.sub(y_op, R.mean(y_op))))
    return {"theta": theta, "r2": R.sub(R.t(np.float64(1.0)), R.div(ss_res, ss_tot))}


def numpy_reference(X, y, alpha=0.1, iterations=ITERATIONS):
    m = X.shape[0]
    theta = np.zeros((X.shape[1], 1))
    for _ in range(iterations):
        theta = theta - (alpha / m) * X.T @ (X @ theta - y)
    prediction = X @ theta
    r2 = 1.0 - ((y - prediction) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    return theta, r2


if __name__ == "__main__":
    R.initialize()
    R.flush()
    R.Graph(name="linear_regression", algorithm="linear_regression", approach="distributed")
    X, y = make_data()
    ops = record(X, y)
    ops["theta"].persist_op("theta")
    ops["r2"].persist_op("r2_score")
    print(R.activate())
    R.execute()
    R.track_progress()
    theta = R.fetch_persisting_op("theta")
    r2 = R.fetch_persisting_op("r2_score")
    print("theta:", theta.flatten().tolist())
    print("r2_score:", float(r2))
    ref_theta, ref_r2 = numpy_reference(X, y)
    print("numpy r2_score:", ref_r2, "max |theta - numpy| =", float(np.abs(theta.numpy() - ref_theta).max()))
