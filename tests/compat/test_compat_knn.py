"""Issue 11, items 10-13: a KNN classifier and a linear regression written the way the original's
requester scripts were (R.Tensor/isinstance, op.shape(), foreach with an op name, find_indices one row per
value, slice of a run-time length, mode of 1-d data, concat onto an empty R.Tensor, R.t(..., name=), a
persist name given twice), equal to numpy, in-process and on real workers (the `execute` fixture)."""
import warnings

import numpy as np
import pytest
import torch

import ravop as R


class NearestNeighbours:
    def fit(self, X, y, k):
        self.X, self.y, self.k = R.t(X), R.t(y), k

    def predict(self, X):
        X = R.Tensor(X)
        distances = R.square_root(R.sub(R.expand_dims(X, axis=1), self.X).pow(R.t(2)).sum(axis=2))
        nearest_distances = distances.foreach(operation='sort').foreach(operation='slice', begin=0, size=self.k)
        labels = R.Tensor([])
        for i in range(X.shape[0]):
            row = distances.gather(R.t([i])).squeeze()
            values = nearest_distances.gather(R.t([i])).squeeze()
            # one row of positions per distance, then the first of each: (k, 1), whose width is known only
            # when it runs
            first = row.find_indices(values).foreach(operation='slice', begin=0, size=1)
            labels = labels.concat(R.mode(R.gather(self.y, first.reshape(shape=[self.k]))))
        labels.persist_op(name="test_prediction")
        return labels


def accuracy(y_true, y_pred):
    if not isinstance(y_true, R.Tensor) and not isinstance(y_true, R.Op):
        y_true = R.Tensor(y_true, name="y_true")
    return R.div(R.sum(R.equal(y_pred, y_true)), y_pred.shape())


def numpy_knn(X_train, y_train, X_test, k):
    distances = np.sqrt(((X_test[:, None, :] - X_train[None, :, :]) ** 2).sum(axis=2))
    nearest = np.argsort(distances, axis=1, kind="stable")[:, :k]
    return np.array([np.bincount(row).argmax() for row in y_train[nearest]])


def test_knn_in_the_original_style_equals_numpy(execute):
    R.Graph(name="knn", algorithm="k-nearest neighbours", approach="distributed")
    rng = np.random.default_rng(3)
    centres = np.array([[0.0, 0.0], [3.0, 3.0], [-3.0, 2.5]])
    labels = rng.integers(0, 3, size=48)
    points = centres[labels] + rng.normal(scale=1.0, size=(48, 2))
    X_train, y_train, X_test, y_test = points[:36], labels[:36], points[36:], labels[36:]
    model = NearestNeighbours()
    model.fit(X_train, y_train, k=5)
    prediction = model.predict(X_test)
    score = accuracy(y_test, prediction)
    assert isinstance(score, R.Op) and not isinstance(score, R.Tensor)
    got_prediction, got_score = execute([prediction, score])
    want = numpy_knn(X_train, y_train, X_test, 5)
    np.testing.assert_array_equal(got_prediction.numpy(), want)
    assert tuple(got_score.shape) == (1,)   # sum / shape(): one element, as in the original
    assert got_score.item() == pytest.approx((want == y_test).mean())


def test_find_indices_gives_one_row_per_value_and_slice_takes_a_run_time_length():
    R.Graph(name="find")
    positions = R.find_indices(R.t([4, 1, 4, 2]), R.t([4, 2]))
    assert positions.shape == (2, -1)
    first = R.slice(positions, begin=(0, 0), size=(2, 1))
    assert first.shape == (2, 1)
    from ravop.runtime.evaluate import evaluate
    got_positions, got_first = evaluate([positions, first])
    assert got_positions.tolist() == [[0, 2], [3, -1]]
    assert got_first.tolist() == [[0], [3]]


def test_mode_of_1d_data_has_shape_1():
    R.Graph(name="mode")
    assert R.mode(R.t([2, 0, 2])).shape == (1,)
    assert R.mode(R.t([[2, 0], [2, 1]]), axis=1).shape == (2,)


def test_tensor_and_scalar_are_classes_and_shape_is_also_a_method():
    R.Graph(name="kinds")
    x = R.t(np.ones((3, 2)), name="x", dtype="ndarray")
    assert isinstance(x, R.Tensor) and not isinstance(x, R.Scalar) and isinstance(R.Scalar(2), R.Scalar)
    assert x.dtype == torch.float64 and x.name == "x" and "'x'" in repr(x)
    assert x.shape == (3, 2) and x.shape[0] == 3
    from ravop.runtime.evaluate import evaluate
    assert evaluate([x.shape()])[0].tolist() == [3, 2]
    assert R.t(x) is x


def test_a_persist_name_given_twice_names_the_later_value_with_a_warning(execute):
    R.Graph(name="twice")
    X = R.t([[1.0, 2.0], [1.0, 3.0]])
    theta = R.t([[0.5], [2.0]])
    first = X.dot(theta).squeeze()
    first.persist_op(name="predicted values")
    second = R.t([[1.0, 2.0], [1.0, 3.0]]).dot(theta).squeeze() + 1
    with pytest.warns(UserWarning, match="predicted values"):
        second.persist_op(name="predicted values")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second.persist_op(name="predicted values")   # the same op again: nothing to say
    got, = execute([second])
    assert got.tolist() == [5.5, 7.5]
    if execute.__name__ == "run_ops":
        assert R.fetch_persisting_op("predicted values").tolist() == [5.5, 7.5]
