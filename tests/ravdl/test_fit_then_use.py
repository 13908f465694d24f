"""Issue 45, fit then use: after the graph that trained it has run, the same model object predicts, evaluates and
trains on in the next graph, and `model.save(path)` / `load_model(path)` keep it for a later process; every value
compared with eager torch on the fetched parameters. Where the values cannot be had, a clear error, never fresh
random weights."""
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ravdl.v2 import NeuralNetwork, Pytorch_Model, load_model
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.core.errors import GraphStateError

ROOT = Path(__file__).resolve().parents[2]

# A new user's workflow, two processes on R.initialize()'s embedded default (its server and workers). The first
# trains, predicts on new data in the next graph, evaluates, and saves; the second loads and predicts again. Each
# prints what it got beside eager torch's value on the weights the first fetched.
SETUP = """
import json, sys
import numpy as np, torch, torch.nn.functional as F
import ravop as R
from ravdl.v2 import NeuralNetwork, load_model
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
rng = np.random.default_rng(0)
X = rng.normal(size=(128, 4)).astype(np.float32)
y = np.eye(2, dtype=np.float32)[(X[:, 0] + X[:, 1] > 0).astype(int)]
X_new = rng.normal(size=(16, 4)).astype(np.float32)
out = sys.argv[1]
def run():
    R.activate(); R.execute(); R.track_progress(progress_bar=False, timeout=300)
def eager(w, data):
    t = torch.as_tensor
    hidden = torch.relu(t(data) @ t(w['Dense_1.weight']).T + t(w['Dense_1.bias']))
    return hidden @ t(w['Dense_2.weight']).T + t(w['Dense_2.bias'])
"""
FIRST = SETUP + """
R.initialize(); R.flush()
R.Graph(name='train')
model = NeuralNetwork(optimizer=Adam(lr=0.01), loss='CrossEntropy')
model.add(Dense(8, input_shape=(4,))); model.add(Activation('relu')); model.add(Dense(2))
history = model.fit(X, y, n_epochs=4, batch_size=32)
model.persist_weights()
run()
w = {k: R.fetch_persisting_op(k).numpy() for k in ('Dense_1.weight', 'Dense_1.bias', 'Dense_2.weight', 'Dense_2.bias')}
np.savez(out + '/weights.npz', **w)
R.Graph(name='predict')
model.predict(X_new).persist_op('prediction')
model.evaluate(X, y).persist_op('loss')
run()
prediction = R.fetch_persisting_op('prediction')
loss = float(R.fetch_persisting_op('loss'))
R.Graph(name='more')
more = model.fit(X, y, n_epochs=2, batch_size=32)
run()
model.save(out + '/model.pkl')
print(json.dumps({'prediction_diff': float((prediction - eager(w, X_new)).abs().max()),
                  'loss': loss, 'eager_loss': float(F.cross_entropy(eager(w, X), torch.as_tensor(y))),
                  'first_losses': history.history['loss'], 'more_losses': more.history['loss']}))
"""
SECOND = SETUP + """
model = load_model(out + '/model.pkl')
R.initialize(); R.flush()
R.Graph(name='after loading')
model.predict(X_new).persist_op('prediction')
more = model.fit(X, y, n_epochs=1, batch_size=32)   # and trains on, Adam's moments included
run()
print(json.dumps({'prediction': R.fetch_persisting_op('prediction').tolist(), 'more_losses': more.history['loss']}))
"""


def run_script(code, out):
    env = {k: v for k, v in os.environ.items() if k != "RAVOP_REDIS_URL"}   # the embedded default, as a new user
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=out, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_new_users_workflow_fit_predict_evaluate_save_load_predict(tmp_path):
    first = run_script(FIRST, tmp_path)
    assert first["prediction_diff"] < 1e-5, first          # the next graph predicts with the trained weights
    assert abs(first["loss"] - first["eager_loss"]) < 1e-5, first
    # the further fit continues from the trained values (and Adam's moments): no restart from random weights
    assert first["more_losses"][0] < first["first_losses"][0] - 0.05, first
    assert first["more_losses"][0] <= first["first_losses"][-1] + 0.02, first
    second = run_script(SECOND, tmp_path)
    # the loaded model carries the values of the end of the second fit: what eager torch gives on them
    model = load_model(str(tmp_path / "model.pkl"))
    saved = {f"{name}.{key}": place.numpy() for name, layer in model.leaf_layers()
             for key, place in layer.places[0].items()}
    rng = np.random.default_rng(0)
    rng.normal(size=(128, 4))
    X_new = torch.as_tensor(rng.normal(size=(16, 4)).astype(np.float32))
    t = torch.as_tensor
    eager = (torch.relu(X_new @ t(saved["Dense_1.weight"]).T + t(saved["Dense_1.bias"])) @ t(saved["Dense_2.weight"]).T
             + t(saved["Dense_2.bias"]))
    np.testing.assert_allclose(second["prediction"], eager.numpy(), atol=1e-5)
    assert second["more_losses"][0] <= first["more_losses"][-1] + 0.02, (first, second)   # no restart
    before = np.load(tmp_path / "weights.npz")
    assert not np.allclose(saved["Dense_1.weight"], before["Dense_1.weight"])   # the second fit moved them


def small_model():
    model = NeuralNetwork(optimizer=Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(4, input_shape=(3,)))
    model.add(Activation("relu"))
    model.add(Dense(1))
    return model


DATA = np.random.default_rng(1).normal(size=(20, 3)).astype(np.float32)
TARGET = DATA[:, :1] * 2


def run():
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)


def test_a_model_pickled_before_its_graph_ran_reads_its_values_from_the_store(engine, module_workers):
    R.Graph(name="train")
    model = small_model()
    model.fit(DATA, TARGET, n_epochs=3, batch_size=10)
    model.persist_weights()
    pickled = pickle.dumps(model)
    assert len(pickled) < 20_000   # references to the store, not the values
    run()
    weight = R.fetch_persisting_op("Dense_1.weight")
    restored = pickle.loads(pickled)
    R.Graph(name="unpickled")
    restored.predict(DATA).persist_op("prediction")
    restored.persist_weights()
    run()
    assert torch.equal(R.fetch_persisting_op("Dense_1.weight"), weight)   # the trained values, not fresh ones


def test_where_the_trained_values_cannot_be_had_the_error_says_what_to_do(engine, module_workers, tmp_path):
    R.Graph(name="not run")
    model = small_model()
    model.fit(DATA, TARGET, n_epochs=1, batch_size=10)
    R.Graph(name="too early")
    with pytest.raises(GraphStateError, match=r"graph 'not run', which has not run.*R.track_progress\(\) it before "
                                              r"using the model in graph 'too early'"):
        model.predict(DATA)
    with pytest.raises(GraphStateError, match=r"has not run.*before saving the model"):
        model.save(str(tmp_path / "early.pkl"))
    assert not (tmp_path / "early.pkl").exists()
    # a hand-written step that no one persisted
    R.Graph(name="by hand")
    hand = small_model()
    hand._backward_pass(R.square_loss(R.t(TARGET), hand._forward_pass(DATA)))
    hand.predict(DATA).persist_op("prediction")
    run()
    R.Graph(name="after the hand-written step")
    with pytest.raises(GraphStateError, match=r"Dense_1.weight was trained in graph 'by hand', which did not "
                                              r"persist it.*model.persist_weights\(\) before R.activate\(\)"):
        hand.predict(DATA)


def test_a_pytorch_model_trains_on_in_the_next_graph(engine, module_workers):
    module = torch.nn.Sequential(torch.nn.Linear(3, 1))
    model = Pytorch_Model(R.model(module))
    model.initialize(Adam(lr=0.05))
    R.Graph(name="torch train")
    first = model.fit(DATA, TARGET, n_epochs=3, batch_size=10, loss="SquareLoss")
    run()
    R.Graph(name="torch more")
    more = model.fit(DATA, TARGET, n_epochs=1, batch_size=10, loss="SquareLoss")
    model.save_model("trained")
    run()
    fetched = R.fetch_persisting_op("trained")
    assert more.history["loss"][0] < first.history["loss"][0]
    with pytest.raises(TypeError, match=r"Pytorch_Model is not pickled.*save_model\(name\) before R.activate"):
        pickle.dumps(model)
    with torch.no_grad():
        expected = F.mse_loss(fetched(torch.as_tensor(DATA)), torch.as_tensor(TARGET))
    assert float(expected) < first.history["loss"][0]


class _Hostile:
    def __reduce__(self):
        import os
        return (os.system, ("echo owned",))


def test_load_model_refuses_a_file_that_names_another_callable(tmp_path):
    path = tmp_path / "hostile.pkl"
    path.write_bytes(pickle.dumps(_Hostile()))
    with pytest.raises(pickle.UnpicklingError, match="may not name (posix|nt|os).system"):
        load_model(str(path))
