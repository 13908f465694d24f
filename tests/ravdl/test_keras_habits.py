"""What a Keras user reaches for on a ravdl model: compile (optimizer and loss; metrics refused), predict and
evaluate (lazy Ops), fit's validation_data on every model kind, and a Pytorch_Model's save refused with the ravdl
way."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ravdl.v2 import Functional, NeuralNetwork, Pytorch_Model
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.runtime.evaluate import evaluate

RNG = np.random.default_rng(0)
X = RNG.normal(size=(40, 4)).astype(np.float32)
Y = (X[:, :1] * 2 + 1).astype(np.float32)


class TwoLayers(Functional):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = Dense(8, input_shape=(4,)), Dense(1)
        self.initialize_params(None)   # the optimizer comes from compile()

    def _forward_pass_call(self, input, training=True):
        return self.out._forward_pass(R.relu(self.hidden._forward_pass(input)))


def sequential():
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(8, input_shape=(4,)))
    model.add(Activation("relu"))
    model.add(Dense(1))
    return model


@pytest.mark.parametrize("make", [sequential, TwoLayers,
                                  lambda: Pytorch_Model(R.model(torch.nn.Sequential(torch.nn.Linear(4, 1))))],
                         ids=["NeuralNetwork", "Functional", "Pytorch_Model"])
def test_compile_predict_and_evaluate_on_every_model_kind(make):
    R.Graph(name="keras habits")
    model = make()
    assert model.compile(optimizer=Adam(lr=0.01), loss="SquareLoss") is model
    assert model.optimizer is not None and model.loss_function is R.square_loss
    prediction, loss = evaluate([model.predict(X), model.evaluate(X, Y)])
    assert prediction.shape == (40, 1)
    torch.testing.assert_close(loss, F.mse_loss(prediction, torch.from_numpy(Y)))
    other = evaluate([model.evaluate(X, Y, loss=lambda y, p: R.sum(R.abs(p - y)))])[0]
    torch.testing.assert_close(other, (prediction - torch.from_numpy(Y)).abs().sum())


def test_what_keras_has_and_ravdl_does_not_is_refused_naming_the_ravdl_way():
    R.Graph(name="keras refusals")
    model = sequential()
    with pytest.raises(NotImplementedError, match=r"metrics=.*not implemented.*model.predict\(X\)"):
        model.compile(metrics=["accuracy"])
    with pytest.raises(TypeError, match=r"ravdl.v2.optimizers instance .*not 'adam'"):
        model.compile(optimizer="adam")
    with pytest.raises(TypeError, match="ravdl has no run_eagerly"):
        model.compile(run_eagerly=True)
    with pytest.raises(ValueError, match="unknown loss 'mse'"):
        model.compile(loss="mse")
    with pytest.raises(NotImplementedError, match=r"Pytorch_Model.save\(path\) is not implemented.*"
                                                  r"model.save_model\(name\) before R.activate\(\).*ravop fetch"):
        Pytorch_Model(R.model(torch.nn.Linear(4, 1))).save("model.keras")
    with pytest.raises(ValueError, match=r"TwoLayers has no loss yet: give evaluate\(X, y, loss=...\)"):
        TwoLayers().evaluate(X, Y)
    with pytest.raises(ValueError, match=r"validation_data must be a pair"):
        model.fit(X, Y, batch_size=10, validation_data=X)


@pytest.mark.parametrize("make", [sequential, TwoLayers], ids=["NeuralNetwork", "Functional"])
def test_fit_takes_validation_data_and_the_compiled_loss(engine, module_workers, make):
    R.Graph(name="keras fit")
    model = make().compile(optimizer=Adam(lr=0.01), loss=R.square_loss)
    history = model.fit(X, Y, n_epochs=3, batch_size=10, validation_data=(X[:8], Y[:8]))
    assert model.loss_function is R.square_loss
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    validation = history.history["val_loss"]
    assert len(validation) == 3 and all(np.isfinite(validation))
    assert validation[-1] < validation[0]   # it trains on the compiled optimizer and loss
