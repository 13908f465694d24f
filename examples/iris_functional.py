"""Iris classification with a Functional RavDL model made of CustomLayers (the seed guide's example),
trained with an explicit loop of `_forward_pass` / `R.square_loss` / `_backward_pass` through the engine.

    python examples/iris_functional.py [epochs]      (or RAVDL_EPOCHS; default 100)
"""
import numpy as np

import ravop as R
from ravdl.v2 import Functional
from ravdl.v2.layers import Activation, BatchNormalization1D, CustomLayer, Dense, Dropout
from ravdl.v2.optimizers import Adam
from ravdl.v2.utils import batch_iterator

from example_data import accuracy, epochs_from_command_line, iris_data


class CustomLayer1(CustomLayer):
    def __init__(self, n_features, n_hidden):
        super().__init__()
        self.d1 = Dense(n_hidden, input_shape=(n_features,))
        self.bn1 = BatchNormalization1D(momentum=0.99, epsilon=0.01)

    def _forward_pass_call(self, input, training=True):
        o = self.d1._forward_pass(input)
        return self.bn1._forward_pass(o, training=training)


class CustomLayer2(CustomLayer):
    def __init__(self):
        super().__init__()
        self.d1 = Dense(30)
        self.dropout = Dropout(0.1)
        self.d2 = Dense(3)

    def _forward_pass_call(self, input, training=True):
        o = self.d1._forward_pass(input)
        o = self.dropout._forward_pass(o, training=training)
        return self.d2._forward_pass(o)


class ANNModel(Functional):
    def __init__(self, optimizer):
        super().__init__()
        self.custom_layer1 = CustomLayer1(n_features=4, n_hidden=15)
        self.custom_layer2 = CustomLayer2()
        self.act = Activation("softmax")
        self.initialize_params(optimizer)

    def _forward_pass_call(self, input, training=True):
        o = self.custom_layer1._forward_pass(input, training=training)
        o = self.custom_layer2._forward_pass(o, training=training)
        return self.act._forward_pass(o)


def record(epochs, X_train, X_test, y_train):
    model = ANNModel(Adam(lr=0.01))
    for epoch in range(1, epochs + 1):
        for batch, (X_batch, y_batch) in enumerate(batch_iterator(X_train, y_train, batch_size=25), start=1):
            out = model._forward_pass(R.t(X_batch))
            loss = R.square_loss(R.t(y_batch), out)
            model._backward_pass(loss)
            loss.persist_op(f"training_loss_epoch_{epoch}_batch_{batch}")
    out = model._forward_pass(R.t(X_test), training=False)
    out.persist_op(name="test_prediction")
    return model


if __name__ == "__main__":
    epochs = epochs_from_command_line(100)
    X_train, X_test, y_train, y_test = iris_data(np.float32)
    R.initialize()
    R.flush()
    R.Graph(name="iris_functional", algorithm="neural_network", approach="distributed")
    record(epochs, X_train, X_test, y_train)
    print(R.activate())
    R.execute()
    R.track_progress()
    print(f"test accuracy: {accuracy(R.fetch_persisting_op('test_prediction'), y_test):.3f}")
