"""The traps of issue 45 met by a warning or an error that names the fix (ravdl/v2/traps.py): a softmax before the
CrossEntropy loss (once per model, through fit or a hand-written loop), BatchNormalization's default momentum 0.99
(once per process), an optimizer given by name, and Keras' fit(epochs=); the right usage warns of nothing. Only
recording: no graph runs."""
import warnings

import numpy as np
import pytest
import torch

import ravop as R
from ravdl.v2 import Functional, NeuralNetwork, Pytorch_Model, traps
from ravdl.v2.layers import Activation, BatchNormalization1D, BatchNormalization2D, Dense
from ravdl.v2.optimizers import Adam
from ravdl.v2.traps import RavdlTrapWarning

RNG = np.random.default_rng(0)
X = RNG.normal(size=(20, 4)).astype(np.float32)
LABELS = RNG.integers(0, 3, size=20)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test starts as a new process would: no warning given yet, and a graph of its own."""
    monkeypatch.setattr(traps, "_given", set())
    R.Graph(name="traps")


def trap_warnings(record):
    return [w for w in record if issubclass(w.category, RavdlTrapWarning)]


def classifier(last=None, loss="CrossEntropy"):
    model = NeuralNetwork(Adam(lr=0.01), loss=loss)
    model.add(Dense(8, input_shape=(4,)))
    model.add(Activation("relu"))
    model.add(Dense(3))
    if last:
        model.add(Activation(last))
    return model


def test_a_softmax_before_cross_entropy_warns_once_per_model_at_the_users_fit():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model = classifier("softmax")
        model.fit(X, LABELS, n_epochs=2, batch_size=10)
        model._backward_pass(model.training_loss(X, LABELS))   # the same model again: no second warning
        R.Graph(name="another")   # each fit persists its losses under the same names: a graph each
        classifier("softmax").fit(X, LABELS, n_epochs=1, batch_size=10)   # another model: its own
    found = trap_warnings(record)
    assert len(found) == 2, [str(w.message) for w in found]
    message = str(found[0].message)
    assert "softmax is applied twice" in message and "Remove the last Activation('softmax')" in message
    assert found[0].filename == __file__   # the user's line, not ravdl's


def test_a_softmax_before_cross_entropy_in_a_hand_written_loop_warns_once():
    class Net(Functional):
        def __init__(self):
            super().__init__()
            self.out = Dense(3, input_shape=(4,))
            self.initialize_params(Adam())

        def _forward_pass_call(self, input, training=True):
            return R.softmax(self.out._forward_pass(input), axis=1)

    model = Net()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            model._backward_pass(R.cross_entropy_loss(R.t(LABELS), model._forward_pass(X)))
    found = trap_warnings(record)
    assert len(found) == 1 and "Net's output is a softmax" in str(found[0].message)
    assert found[0].filename == __file__


def test_logits_into_cross_entropy_and_a_softmax_into_square_loss_warn_of_nothing():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        classifier().fit(X, LABELS, n_epochs=1, batch_size=10)
        one_hot = np.eye(3, dtype=np.float32)[LABELS]
        R.Graph(name="square loss")
        classifier("softmax", loss="SquareLoss").fit(X, one_hot, n_epochs=1, batch_size=10)
    assert trap_warnings(record) == []


def test_batch_norm_s_default_momentum_warns_once_per_process_and_stays_0_99():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        layers = [BatchNormalization1D(), BatchNormalization2D(4), BatchNormalization1D()]
    found = trap_warnings(record)
    assert len(found) == 1, [str(w.message) for w in found]
    message = str(found[0].message)
    assert "BatchNormalization1D's default momentum=0.99" in message and "pass momentum=0.1" in message
    assert found[0].filename == __file__
    assert [layer.momentum for layer in layers] == [0.99] * 3 and type(layers[0].momentum) is float


def test_batch_norm_with_a_momentum_given_warns_of_nothing():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        BatchNormalization1D(momentum=0.1)
        BatchNormalization2D(4, momentum=0.99)   # the original default, given on purpose
    assert trap_warnings(record) == []


class Plain(Functional):
    def __init__(self, optimizer):
        super().__init__()
        self.out = Dense(1, input_shape=(4,))
        self.initialize_params(optimizer)

    def _forward_pass_call(self, input, training=True):
        return self.out._forward_pass(input)


def test_an_optimizer_given_by_name_is_refused_at_construction_naming_the_class():
    fix = r"ravdl.v2.optimizers.Adam\(\).*not 'adam' \(a name\)"
    with pytest.raises(TypeError, match=r"NeuralNetwork\(optimizer=\) takes .*" + fix):
        NeuralNetwork(optimizer="adam")
    with pytest.raises(TypeError, match=r"Plain.initialize_params\(optimizer\) takes .*" + fix):
        Plain("adam")
    with pytest.raises(TypeError, match=r"Pytorch_Model.initialize\(optimizer\) takes .*" + fix):
        Pytorch_Model(R.model(torch.nn.Linear(4, 1))).initialize("adam")
    NeuralNetwork(optimizer=Adam())   # the right usage
    Plain(Adam())


@pytest.mark.parametrize("make", [lambda: classifier(), lambda: Plain(Adam()),
                                  lambda: Pytorch_Model(R.model(torch.nn.Linear(4, 3)))],
                         ids=["NeuralNetwork", "Functional", "Pytorch_Model"])
def test_fit_with_keras_epochs_points_to_n_epochs(make):
    model = make()
    with pytest.raises(TypeError, match=r"fit\(\) takes n_epochs=, not Keras' epochs=: fit\(X, y, n_epochs=5"):
        model.fit(X, LABELS, epochs=5)
    with pytest.raises(TypeError, match=r"fit\(\) got an unexpected keyword argument 'verbose'"):
        model.fit(X, LABELS, n_epochs=1, verbose=0)
