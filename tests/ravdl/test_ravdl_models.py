"""RavDL models: NeuralNetwork and Functional bookkeeping (summary counts equal torch's, persisted names,
gradient accumulation), save_model's round trip to a TorchScript-able torch module, independence of two
models, and training again in a new graph. Programs run in-process with `ravop.runtime.evaluate.evaluate`."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch import nn

from ravdl.v2 import Functional, NeuralNetwork, export, trained_values
from ravdl.v2.layers import (Activation, BatchNormalization1D, BatchNormalization2D, Conv2D, CustomLayer, Dense,
                             Dropout, Flatten, LayerNormalization, MaxPooling2D)
from ravdl.v2.optimizers import Adam, RMSprop
from ravdl.v2.utils import batch_iterator
import ravop as R
from ravop.core.errors import GraphStateError
from ravop.record.graph import current_graph
from ravop.runtime.evaluate import evaluate, evaluate_persisted


def iris_model(optimizer=None):
    model = NeuralNetwork(optimizer or Adam(), loss="SquareLoss")
    model.add(Dense(15, input_shape=(4,)))
    model.add(BatchNormalization1D())
    model.add(Dense(30))
    model.add(Dropout(0.5))
    model.add(Dense(3))
    model.add(Activation("softmax"))
    return model


def cnn_model():
    model = NeuralNetwork(Adam(), loss="CrossEntropy")
    model.add(Conv2D(1, 16, 3, padding="same", input_shape=(1, 8, 8)))
    model.add(Activation("relu"))
    model.add(MaxPooling2D(2))
    model.add(Dropout(0.25))
    model.add(BatchNormalization2D(16))
    model.add(Conv2D(16, 32, 3, padding="same", padding_mode="replicate"))
    model.add(Activation("relu"))
    model.add(Flatten())
    model.add(Dense(256))
    model.add(Dense(10))
    model.add(Activation("softmax"))
    return model


def torch_cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding="same"), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
                         nn.BatchNorm2d(16), nn.Conv2d(16, 32, 3, padding="same"), nn.ReLU(), nn.Flatten(),
                         nn.Linear(32 * 4 * 4, 256), nn.Linear(256, 10), nn.Softmax(-1))


def fetch_in_process(name):
    """What R.fetch_persisting_op(name) returns for a saved model, computed in this process."""
    graph = current_graph()
    kind, spec, names = graph.bundles[name]
    assert kind == export.KIND
    values = evaluate([graph.persisted[persist_name] for persist_name in names.values()])
    return export.load(json.loads(json.dumps(spec)), dict(zip(names, values)))


# ------------------------------------------------------------------------------ summary

def test_summary_counts_and_shapes_equal_torch(capsys):
    R.Graph(name="summary")
    model = iris_model()
    torch_iris = nn.Sequential(nn.Linear(4, 15), nn.BatchNorm1d(15), nn.Linear(15, 30), nn.Dropout(0.5),
                               nn.Linear(30, 3), nn.Softmax(-1))
    assert model.parameter_count() == sum(p.numel() for p in torch_iris.parameters()) == 678
    model.summary()
    text = capsys.readouterr().out
    assert "Dense_3" in text and "(None, 30)" in text and "Total params: 678" in text

    cnn, reference = cnn_model(), torch_cnn()
    assert cnn.parameter_count() == sum(p.numel() for p in reference.parameters())
    x = torch.zeros(2, 1, 8, 8)
    torch_shapes = []
    for module in reference:
        x = module(x)
        torch_shapes.append(tuple(x.shape[1:]))
    assert [shape for _, _, shape, _ in cnn._summary_rows()] == torch_shapes


def test_summary_needs_a_known_input_shape():
    model = NeuralNetwork(Adam())
    model.add(Dense(3))
    with pytest.raises(ValueError, match="input_shape"):
        model.summary()


# ------------------------------------------------------------------------------ fit and friends

def _fit_losses(names):
    values = evaluate_persisted(current_graph(), names)
    return torch.stack([values[name] for name in names])


def test_fit_persists_batch_and_validation_losses_and_learns():
    R.Graph(name="fit")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 4))
    y = np.eye(3)[(X[:, 0] > 0).astype(int) + (X[:, 1] > 0).astype(int)]
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss", validation_data=(X[:20], y[:20]))
    model.add(Dense(16, input_shape=(4,)))
    model.add(Activation("relu"))
    model.add(Dense(3))
    history = model.fit(X, y, n_epochs=30, batch_size=25, shuffle=True, seed=4)
    assert len(history) == 30 * 3
    assert history[0] == "training_loss_epoch_1_batch_1" and history[-1] == "training_loss_epoch_30_batch_3"
    values = evaluate_persisted(current_graph())
    assert "training_loss_epoch_1_batch_4" not in values
    # the losses, and the values the next graph starts from (ravdl.v2.trained_values)
    assert {name for name in values if not name.startswith(trained_values.PREFIX)} == \
        set(history) | {f"validation_loss_epoch_{e}" for e in range(1, 31)}
    assert len(values) - len(history) - 30 == 4 + 4 * 2   # 2 layers' weight and bias, and Adam's 2 moments of each
    assert float(values["validation_loss_epoch_30"]) < 0.5 * float(values["validation_loss_epoch_1"])


def test_shuffled_fit_is_reproducible_and_differs_by_seed():
    X, y = np.random.default_rng(1).normal(size=(40, 4)), np.random.default_rng(2).normal(size=(40, 3))

    def losses(seed):
        R.Graph(name="shuffle")
        model = NeuralNetwork(Adam(lr=0.01))
        model.add(Dense(3, input_shape=(4,)))
        return _fit_losses(model.fit(X, y, n_epochs=2, batch_size=10, shuffle=True, seed=seed))

    assert torch.equal(losses(3), losses(3))
    assert not torch.equal(losses(3), losses(4))


def test_predict_is_eval_mode_and_does_not_move_state():
    R.Graph(name="predict")
    model = iris_model()
    X = np.random.default_rng(0).normal(size=(10, 4))
    model.train_on_batch(X, np.eye(3)[np.arange(10) % 3])
    bn = model.layers[1]
    before = dict(bn.buffers)
    first, second = model.predict(X), model.test_on_batch(X)
    assert bn.buffers == before
    a, b = evaluate([first, second])
    assert torch.equal(a, b)   # no dropout in eval


def test_batch_iterator_order_partial_batch_and_shuffle():
    X, y = np.arange(10).reshape(5, 2), np.arange(5)
    batches = list(batch_iterator(X, y, batch_size=2))
    assert [b[1].tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    assert [b.tolist() for b in batch_iterator(X, batch_size=4)] == [X[:4].tolist(), X[4:].tolist()]
    shuffled = np.concatenate([b[1] for b in batch_iterator(X, y, batch_size=2, shuffle=True, seed=0)])
    assert sorted(shuffled.tolist()) == list(range(5)) and shuffled.tolist() != list(range(5))
    again = np.concatenate([b[1] for b in batch_iterator(X, y, batch_size=2, shuffle=True, seed=0)])
    assert shuffled.tolist() == again.tolist()
    with pytest.raises(ValueError, match="rows"):
        next(batch_iterator(X, y[:3]))


# ------------------------------------------------------------------------------ Functional and CustomLayer

class Block(CustomLayer):
    def __init__(self, hidden, input_shape=None):
        super().__init__()
        self.d1 = Dense(hidden, input_shape=input_shape)
        self.norm = LayerNormalization()
        self.drop = Dropout(0.0)

    def _forward_pass_call(self, input, training=True):
        o = self.d1._forward_pass(input)
        return self.drop._forward_pass(R.relu(self.norm._forward_pass(o)), training=training)


class ResidualNet(Functional):
    def __init__(self, optimizer):
        super().__init__()
        self.block = Block(8, input_shape=(5,))
        self.extra = [Dense(8), BatchNormalization1D(momentum=0.5)]
        self.head = Dense(3)
        self.initialize_params(optimizer)

    def _forward_pass_call(self, input, training=True):
        h = self.block._forward_pass(input, training=training)
        h = h + self.extra[1]._forward_pass(self.extra[0]._forward_pass(h), training=training) * 0.5
        return R.softmax(self.head._forward_pass(h))


class TorchResidualNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Module()
        self.block.d1, self.block.norm = nn.Linear(5, 8), nn.LayerNorm(8)
        self.extra = nn.ModuleList([nn.Linear(8, 8), nn.BatchNorm1d(8, eps=0.01, momentum=0.5)])
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.block.norm(self.block.d1(x)))
        h = h + self.extra[1](self.extra[0](h)) * 0.5
        return torch.softmax(self.head(h), -1)


def test_functional_names_layers_by_attribute_path_like_torch():
    R.Graph(name="functional names")
    model = ResidualNet(Adam())
    model._forward_pass(np.zeros((2, 5)))
    names = [name for name, _ in model.leaf_layers()]
    assert names == ["block.d1", "block.norm", "block.drop", "extra.0", "extra.1", "head"]
    state_keys = {f"{name}.{key}" for name, layer in model.leaf_layers() for key in layer.state()}
    assert state_keys == set(TorchResidualNet().state_dict()) - {"extra.1.num_batches_tracked"}
    assert model.parameter_count() == sum(p.numel() for p in TorchResidualNet().parameters())


def test_functional_training_and_gradient_accumulation_match_torch():
    """Two backward passes with step=False and a third with step=True apply the summed gradients, as torch
    does when .grad accumulates over backward calls between optimizer steps."""
    R.Graph(name="accumulate")
    model = ResidualNet(RMSprop(lr=0.01))
    data = [(torch.randn(6, 5, generator=torch.Generator().manual_seed(i)), torch.rand(6, 3)) for i in range(9)]
    model._forward_pass(data[0][0], training=False)   # builds the layers with their default initialisation
    reference = TorchResidualNet()
    initial = evaluate([op for _, layer in model.leaf_layers() for op in layer.state().values()])
    keys = [f"{name}.{key}" for name, layer in model.leaf_layers() for key in layer.state()]
    reference.load_state_dict(dict(zip(keys, initial)), strict=False)
    optimizer = torch.optim.RMSprop(reference.parameters(), lr=0.01, foreach=False)
    losses, want = [], []
    for i, (x, y) in enumerate(data):
        loss = R.square_loss(R.t(y), model._forward_pass(x))
        model._backward_pass(loss, step=i % 3 == 2)
        losses.append(loss)
        value = TF.mse_loss(reference(x), y)
        value.backward()
        if i % 3 == 2:
            optimizer.step()
            optimizer.zero_grad()
        want.append(value.detach())
    got = evaluate(losses + [layer.params["weight"] for _, layer in model.leaf_layers() if "weight" in layer.params])
    torch.testing.assert_close(torch.stack(got[:len(losses)]), torch.stack(want), rtol=0, atol=1e-5)
    torch.testing.assert_close(got[-1], reference.head.weight.detach(), rtol=0, atol=1e-5)


def test_functional_without_initialize_params_is_a_clear_error():
    class Forgetful(Functional):
        def __init__(self):
            super().__init__()
            self.d = Dense(2)

        def _forward_pass_call(self, input, training=True):
            return self.d._forward_pass(input)

    with pytest.raises(ValueError, match="initialize_params"):
        Forgetful()._forward_pass(np.zeros((2, 3)))


# ------------------------------------------------------------------------------ save_model

def test_saved_sequential_cnn_is_a_torchscript_module_computing_predict():
    R.Graph(name="save cnn")
    model = cnn_model()
    rng = np.random.default_rng(0)
    for _ in range(3):
        model.train_on_batch(rng.normal(size=(16, 1, 8, 8)), rng.integers(0, 10, 16))
    X_new = rng.normal(size=(5, 1, 8, 8)).astype(np.float32)
    prediction = model.predict(X_new)
    model.save_model("my_net")
    module = fetch_in_process("my_net")
    want = evaluate(prediction)
    assert isinstance(module, nn.Module) and not module.training
    torch.testing.assert_close(module(torch.from_numpy(X_new)), want, rtol=0, atol=1e-6)
    scripted = torch.jit.script(module)
    torch.testing.assert_close(scripted(torch.from_numpy(X_new)), want, rtol=0, atol=1e-6)
    assert int(module.get_submodule("BatchNormalization2D_1").num_batches_tracked) == 3
    assert set(module.state_dict()) >= {"Conv2D_1.weight", "Dense_2.bias", "BatchNormalization2D_1.running_var"}


def test_saved_functional_with_custom_layers_and_free_ops_computes_predict():
    R.Graph(name="save functional")
    model = ResidualNet(Adam(lr=0.01))
    rng = np.random.default_rng(1)
    for _ in range(3):
        loss = R.square_loss(R.t(rng.random((6, 3)), dtype="float32"), model._forward_pass(rng.normal(size=(6, 5))))
        model._backward_pass(loss)
    X_new = torch.randn(4, 5)
    prediction = model._forward_pass(X_new, training=False)
    model.save_model("residual")
    module = fetch_in_process("residual")
    want = evaluate(prediction)
    torch.testing.assert_close(module(X_new), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.jit.script(module)(X_new), want, rtol=0, atol=1e-6)
    reference = TorchResidualNet()   # the same attribute structure loads the saved weights
    reference.load_state_dict(module.state_dict(), strict=False)
    reference.eval()
    torch.testing.assert_close(reference(X_new), want, rtol=0, atol=1e-6)


def test_save_model_names_an_op_it_cannot_export():
    class Sorting(Functional):
        def __init__(self):
            super().__init__()
            self.d = Dense(3, input_shape=(4,))
            self.initialize_params(Adam())

        def _forward_pass_call(self, input, training=True):
            return R.sort(self.d._forward_pass(input))

    R.Graph(name="unsaveable")
    with pytest.raises(ValueError, match="'sort'"):
        Sorting().save_model("x")


# ------------------------------------------------------------------------------ independence and re-runs

def test_two_models_in_one_graph_do_not_share_state():
    R.Graph(name="two models")
    a, b = iris_model(), iris_model()
    X, y = np.random.default_rng(0).normal(size=(10, 4)), np.eye(3)[np.arange(10) % 3]
    b.predict(X)
    b_before = {(i, k): op for i, layer in enumerate(b.layers) for k, op in layer.state().items()}
    for _ in range(3):
        a.train_on_batch(X, y)
    b_after = {(i, k): op for i, layer in enumerate(b.layers) for k, op in layer.state().items()}
    assert b_before == b_after   # training a recorded nothing into b
    a_weight, b_weight = evaluate([a.layers[0].params["weight"], b.layers[0].params["weight"]])
    assert not torch.equal(a_weight, b_weight)
    assert a.optimizer.state.keys().isdisjoint(b.optimizer.state.keys())


def test_training_again_in_a_new_graph_repeats_the_run_and_old_models_stay_in_theirs():
    X, y = np.random.default_rng(0).normal(size=(20, 4)), np.eye(3)[np.arange(20) % 3]

    def run():
        R.Graph(name="again", seed=11)
        model = iris_model(Adam(lr=0.01))
        return model, _fit_losses(model.fit(X, y, n_epochs=2, batch_size=10))

    first_model, first = run()
    _, second = run()
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    with pytest.raises(GraphStateError, match="trained values are in graph 'again', which has not run to its end: "
                                              r"R.activate\(\), R.execute\(\) and R.track_progress\(\) it before "
                                              "using the model in graph 'again'"):
        first_model.predict(X)   # in a new graph, once its own has run (tests/ravdl/test_fit_then_use.py)


def test_untrained_model_saves_from_its_declared_input_shape():
    from ravdl.v2.layers import Embedding

    R.Graph(name="save untrained")
    model = NeuralNetwork(Adam(), loss="CrossEntropy")
    model.add(Embedding(10, 4, input_shape=(3,)))
    model.add(Flatten())
    model.add(Dense(2))
    model.save_model("embedder")
    module = fetch_in_process("embedder")
    tokens = torch.tensor([[1, 2, 3], [9, 0, 9]])
    state = {f"{name}.{key}": op for name, layer in model.leaf_layers() for key, op in layer.state().items()}
    weights = dict(zip(state, evaluate(list(state.values()))))
    want = TF.linear(TF.embedding(tokens, weights["Embedding_1.weight"]).flatten(1), weights["Dense_1.weight"],
                     weights["Dense_1.bias"])
    torch.testing.assert_close(module(tokens), want)
