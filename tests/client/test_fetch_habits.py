"""Fetching as a new user tries it: the persisted Op itself instead of its name, an earlier graph's values
(graph=), and numpy on what comes back (np.asarray with numpy 2's dtype and copy arguments); numpy on an Op
that has not run says why it cannot. Real server and workers."""
import numpy as np
import pytest
import torch

from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.core.errors import GraphStateError, UnknownPersistName


def _run(name, scale):
    graph = R.Graph(name=name)
    y = R.t(torch.arange(1.0, 4.0)) * scale
    y.persist_op("y")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    return graph, y


def test_the_persisted_op_itself_fetches_its_value(engine, module_workers):
    _, y = _run("op itself", 2.0)
    torch.testing.assert_close(R.fetch_persisting_op(y), torch.tensor([2.0, 4.0, 6.0]))
    R.Graph(name="not persisted")
    loose = R.t([1.0]) + 1
    with pytest.raises(UnknownPersistName, match=r"was not persisted: call op.persist_op\('name'\)"):
        R.fetch_persisting_op(loose)
    with pytest.raises(TypeError, match="takes a persist name or a persisted Op, not int"):
        R.fetch_persisting_op(3)


def test_an_earlier_graphs_values_stay_fetchable(engine, module_workers):
    first, first_y = _run("first", 2.0)
    _, second_y = _run("second", 3.0)
    torch.testing.assert_close(R.fetch_persisting_op("y"), torch.tensor([3.0, 6.0, 9.0]))
    for graph in (first, first.id, "first"):
        torch.testing.assert_close(R.fetch_persisting_op("y", graph=graph), torch.tensor([2.0, 4.0, 6.0]))
    torch.testing.assert_close(R.fetch_persisting_op(first_y), torch.tensor([2.0, 4.0, 6.0]))  # its own graph
    torch.testing.assert_close(R.fetch_persisting_op(second_y), torch.tensor([3.0, 6.0, 9.0]))
    never = R.Graph(name="never activated")
    with pytest.raises(GraphStateError, match="'never activated' has not been activated"):
        R.fetch_persisting_op("y", graph=never)


def test_numpy_takes_fetched_and_predicted_values(engine, module_workers):
    R.Graph(name="predict")
    X = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(2, input_shape=(4,)))
    prediction = model.predict(X)
    with pytest.raises(TypeError, match=r"numpy.asarray\(\) of <Op .*: ops are lazy.*R.fetch_persisting_op"):
        np.asarray(prediction)   # before: "Could not convert object to sequence"
    prediction.persist_op("prediction")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    fetched = R.fetch_persisting_op(prediction)
    array = np.asarray(fetched)
    assert array.shape == (6, 2) and array.dtype == np.float32
    assert np.shares_memory(array, fetched.numpy())   # no copy where none is needed
    assert np.array(fetched, dtype=np.float64, copy=True).dtype == np.float64
    assert not np.shares_memory(np.array(fetched, copy=True), array)
    with pytest.raises(ValueError, match="without a copy"):
        np.array(fetched, dtype=np.float64, copy=False)


def test_numpy_operators_on_an_op_record_the_op(engine):
    R.Graph(name="numpy operators")
    x = R.t([1.0, 2.0])
    assert (np.ones(2, np.float32) + x).op == "add" and (np.float32(2) * x).op == "mul"
