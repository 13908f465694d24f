"""Issue 11: the original API's forms, each in a small script of the original style, on the real server and
workers where running matters (items 1-9, 14, 15; KNN-style items 10-13 are in test_compat_knn.py)."""
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ravdl.v2 import Functional, NeuralNetwork
from ravdl.v2.layers import (Activation, Add, Concat, CustomLayer, Dense, Division, Dot, Multiply, Power, Reshape,
                             Subtract, Transpose)
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.runtime.evaluate import evaluate
from ravop.store.keys import token_namespace

ROOT = Path(__file__).resolve().parents[2]
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + "eyJzdWIiOiJyZXF1ZXN0ZXIifQ" * 4 + ".c2lnbmF0dXJ"  # 153 chars


def run(timeout=300):
    R.activate()
    R.execute(participants=1)
    R.track_progress(progress_bar=False, timeout=timeout)


# ---------------------------------------------------------------------------------------------- item 1

def test_ravenverse_token_of_any_length_is_accepted_and_never_echoed(server, module_workers):
    assert len(JWT) == 153
    session = R.initialize(ravenverse_token=JWT, redis_url=server.url)
    try:
        assert session.token == token_namespace(JWT) and JWT not in session.token
        R.flush()
        R.Graph(name="token")
        (R.t([1, 2]) * 2).persist_op("doubled")
        run()
        assert R.fetch_persisting_op("doubled").tolist() == [2, 4]
        assert not any(JWT.encode() in key for key in session.client.keys("*"))
        with pytest.raises(ValueError) as error:
            R.initialize(token=JWT + "x", ravenverse_token=JWT, redis_url=server.url)
        assert JWT not in str(error.value)
    finally:
        R.initialize(ravenverse_token=JWT, redis_url=server.url)
        R.flush()


# ---------------------------------------------------------------------------------------------- item 2

def test_the_original_module_layout_imports():
    from ravdl.v2.utils import batch_iterator as short
    from ravdl.v2.utils.data_manipulation import batch_iterator
    assert batch_iterator is short
    assert [len(b) for b in batch_iterator(np.zeros(5), batch_size=2)] == [2, 2, 1]


# ---------------------------------------------------------------------------------------- items 3 and 4

def test_float64_data_reaches_layers_as_float32_and_layer_outputs_fetch_as_result(engine, module_workers):
    R.Graph(name="cast")
    X = R.t(np.random.default_rng(0).random((6, 4)))                  # float64, as R.t of an array stays
    out = Activation('softmax')._forward_pass(Dense(3, input_shape=(4,))._forward_pass(X))
    assert X.dtype == torch.float64 and out.dtype == torch.float32
    out.persist_op("prediction")
    R.cast(X, 'float32').persist_op("cast")
    X.astype(np.int32).persist_op("astype")
    (R.t([1, 2]) + 1).persist_op("raw")
    run()
    prediction = R.fetch_persisting_op("prediction")
    assert prediction['result'].shape == (6, 3) and torch.equal(prediction['result'], prediction)
    assert torch.allclose(prediction.sum(1), torch.ones(6))
    assert R.fetch_persisting_op("cast").dtype == torch.float32
    assert R.fetch_persisting_op("astype").dtype == torch.int32
    raw = R.fetch_persisting_op("raw")
    assert raw.tolist() == [2, 3] and raw['result'].tolist() == [2, 3] and type(raw + 1) is torch.Tensor
    with pytest.raises(KeyError, match="result"):
        raw['output']


# ---------------------------------------------------------------------------------------------- item 5

class Attention(CustomLayer):
    def __init__(self):
        super().__init__()
        self.query = Dense(4, input_shape=(4,))
        self.transpose, self.dot1, self.dot2, self.div, self.add = Transpose(), Dot(), Dot(), Division(), Add()
        self.softmax = Activation('softmax')

    def _forward_pass_call(self, q, k, v, training=True, mask=None):
        scores = self.div._forward_pass(self.dot1._forward_pass(self.query._forward_pass(q),
                                                                self.transpose._forward_pass(k, axes=(-2, -1))), 2.0)
        if mask is not None:
            scores = self.add._forward_pass(scores, R.t(mask * -1e9))
        return self.dot2._forward_pass(self.softmax._forward_pass(scores), v)


class Net(Functional):
    def __init__(self, optimizer):
        super().__init__()
        self.attention = Attention()
        self.reshape, self.concat, self.sub, self.mul, self.pow = Reshape(contiguous="True"), Concat(), Subtract(), \
            Multiply(), Power()
        self.initialize_params(optimizer)

    def _forward_pass_call(self, x, training=True, batch_size=None, mask=None):
        y = self.attention._forward_pass(x, x, x, training=training, mask=mask)
        y = self.concat._forward_pass(y, self.sub._forward_pass(x, self.mul._forward_pass(x, self.pow._forward_pass(
            x, power=2))), axis=-1)
        return self.reshape._forward_pass(y, shape=(batch_size, -1))


def test_math_layers_and_layers_of_several_inputs_and_keywords_equal_torch():
    R.Graph(name="math layers")
    x = np.random.default_rng(1).standard_normal((2, 3, 4))
    mask = np.triu(np.ones((3, 3)), k=1)
    model = Net(Adam())
    out = model._forward_pass(R.t(x), batch_size=2, mask=mask)
    query = model.attention.query
    got, weight, bias = evaluate([out, query.params["weight"], query.params["bias"]])
    t = torch.from_numpy(x).float()
    scores = torch.nn.functional.linear(t, weight, bias) @ t.transpose(-2, -1) / 2.0
    scores = scores - torch.from_numpy(mask).float() * 1e9
    want = torch.cat([torch.softmax(scores, -1) @ t, t - t * t ** 2], -1).reshape(2, -1)
    assert got.shape == (2, 24) and torch.allclose(got, want, atol=1e-5)
    model._backward_pass(R.sum(out))   # the math layers are differentiable: the query weights move
    assert not torch.equal(evaluate([query.params["weight"]])[0], weight)


def test_transpose_of_two_axes_swaps_them_and_dense_takes_sequence_input():
    R.Graph(name="transpose")
    x = R.t(np.arange(24.0).reshape(2, 3, 4))
    assert Transpose()._forward_pass(x, axes=(1, 2)).shape == (2, 4, 3)
    assert Transpose()._forward_pass(x, axes=(0, 2, 1)).shape == (2, 4, 3)
    assert Dense(5, input_shape=(4,))._forward_pass(x).shape == (2, 3, 5)
    with pytest.raises(ValueError, match="input_shape"):
        Dense(5, input_shape=(3,))._forward_pass(x)


# ---------------------------------------------------------------------------------------- items 6 and 7

def test_wrapped_index_string_and_string_booleans_record_and_run(execute):
    R.Graph(name="generate")
    logits = R.t(np.random.default_rng(2).standard_normal((2, 5, 3)))
    last = R.index(logits, indices=str({"indices": "[:,-1,:]"}))
    token = R.argmax(last, axis=-1, keepdims="True")
    x = R.concat(R.t(np.zeros((2, 5), dtype=np.int64)), token, axis=-1)
    assert last.shape == (2, 3) and token.shape == (2, 1) and x.shape == (2, 6)
    with pytest.raises(TypeError, match="keepdims"):
        R.argmax(last, axis=-1, keepdims="yes")
    got_last, got_x = execute([last, x])
    want = np.random.default_rng(2).standard_normal((2, 5, 3))[:, -1, :]
    np.testing.assert_allclose(got_last.numpy(), want)
    assert got_x[:, -1].tolist() == want.argmax(-1).tolist()


# ------------------------------------------------------------------------------------------ items 8, 9, 15

def iris_like(n=60, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    X = np.eye(3)[labels] @ rng.standard_normal((3, 4)) * 2 + rng.normal(scale=0.3, size=(n, 4))
    return X, np.eye(3)[labels], labels


def sequential():
    model = NeuralNetwork(optimizer=Adam(lr=0.01), loss='SquareLoss')
    model.add(Dense(8, input_shape=(4,)))
    model.add(Activation('relu'))
    model.add(Dense(3))
    model.add(Activation('softmax'))
    return model


def test_fit_saves_persists_weights_pickles_and_exports_onnx(engine, module_workers, tmp_path, capsys):
    import onnxruntime
    R.Graph(name="ann")
    X, y, labels = iris_like()
    model = sequential()
    model.fit(X, y, n_epochs=10, batch_size=20, save_model=True, persist_weights=True)
    model.predict(X).persist_op("prediction")
    pickled = pickle.dumps(model)
    assert len(pickled) < 20_000   # its structure, not the graph's data
    run()
    module = R.fetch_persisting_op("model")
    weight = R.fetch_persisting_op("Dense_1.weight")
    assert torch.equal(module.Dense_1.weight, weight)
    prediction = R.fetch_persisting_op("prediction")['result']
    assert (prediction.argmax(1).numpy() == labels).mean() > 0.8
    restored = pickle.loads(pickled)   # as a later process of the original's scripts did
    capsys.readouterr()
    restored.summary()
    assert "Dense_2" in capsys.readouterr().out
    path = restored.get_onnx_model(str(tmp_path / "ann"))
    session = onnxruntime.InferenceSession(path)
    got = session.run(None, {"X": X.astype(np.float32)})[0]
    np.testing.assert_allclose(got, prediction.numpy(), rtol=1e-4, atol=1e-5)


def test_pickle_refuses_graph_values_and_onnx_needs_a_saved_model():
    R.Graph(name="pickle")
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(R.t([1.0]))
    with pytest.raises(ValueError, match="save the model"):
        sequential().get_onnx_model("never")
    with pytest.raises(TypeError, match="save_model"):
        X, y, _ = iris_like(10)
        sequential().fit(X, y, n_epochs=1, batch_size=5, save_model=1)


# --------------------------------------------------------------------------------------------- item 14

def test_get_my_graphs_prints_the_table_and_a_later_process_finds_embedded_graphs(tmp_path):
    env_code = ("import ravop as R\n"
                "R.initialize(ravenverse_token='a-requester', workers=1)\n")
    first = env_code + ("R.flush()\n"
                        "R.Graph(name='first', algorithm='addition', approach='distributed')\n"
                        "(R.t([1, 2]) + 1).persist_op('c')\n"
                        "R.activate(); R.execute(); R.track_progress(progress_bar=False)\n")
    later = env_code + ("R.get_my_graphs()\n"
                        "print('c =', R.fetch_persisting_op('c')['result'].tolist())\n")
    env = {"RAVOP_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    for code in (first, later):
        done = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, **env},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(all(h in line for h in ("Id", "Name", "Approach", "Algorithm", "Rules", "Status")) for line in lines)
    assert any("first" in line and "addition" in line and "done" in line for line in lines)
    assert "c = [2, 3]" in lines
