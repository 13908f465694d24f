"""Handwritten digits (sklearn's 8x8 digits) with a Functional RavDL CNN: the same network as
digits_cnn_sequential.py written as a model class with two convolution blocks (CustomLayers), trained with
an explicit loop through the engine.

    python examples/digits_cnn_functional.py [epochs]      (or RAVDL_EPOCHS; default 15)
"""
import numpy as np

import ravop as R
from ravdl.v2 import Functional
from ravdl.v2.layers import BatchNormalization2D, Conv2D, CustomLayer, Dense, Dropout, Flatten, MaxPooling2D
from ravdl.v2.optimizers import Adam
from ravdl.v2.utils import batch_iterator

from example_data import accuracy, digits_data, epochs_from_command_line

BATCH_SIZE = 64


class ConvBlock(CustomLayer):
    """Conv2D -> relu -> MaxPooling2D -> Dropout -> BatchNormalization2D."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = Conv2D(in_channels, out_channels, 3, padding="same")
        self.pool = MaxPooling2D(2)
        self.dropout = Dropout(0.1)
        self.norm = BatchNormalization2D(out_channels)

    def _forward_pass_call(self, input, training=True):
        o = R.relu(self.conv._forward_pass(input))
        o = self.dropout._forward_pass(self.pool._forward_pass(o), training=training)
        return self.norm._forward_pass(o, training=training)


class CNN(Functional):
    def __init__(self, optimizer):
        super().__init__()
        self.block1 = ConvBlock(1, 16)
        self.block2 = ConvBlock(16, 32)
        self.flatten = Flatten()
        self.hidden = Dense(256)
        self.out = Dense(10)
        self.initialize_params(optimizer)

    def _forward_pass_call(self, input, training=True):
        o = self.block2._forward_pass(self.block1._forward_pass(input, training=training), training=training)
        o = R.relu(self.hidden._forward_pass(self.flatten._forward_pass(o)))
        return R.softmax(self.out._forward_pass(o))


def record(epochs, X_train, X_test, y_train):
    model = CNN(Adam(lr=0.001))
    rng = np.random.default_rng(0)
    for epoch in range(1, epochs + 1):
        batches = batch_iterator(X_train, y_train, batch_size=BATCH_SIZE, shuffle=True, seed=rng)
        for batch, (X_batch, y_batch) in enumerate(batches, start=1):
            loss = R.cross_entropy_loss(R.t(y_batch), model._forward_pass(R.t(X_batch)))
            model._backward_pass(loss)
            loss.persist_op(f"training_loss_epoch_{epoch}_batch_{batch}")
    model._forward_pass(R.t(X_test), training=False).persist_op(name="test_prediction")
    model.save_model("digits_cnn")
    return model


if __name__ == "__main__":
    epochs = epochs_from_command_line(15)
    X_train, X_test, y_train, y_test = digits_data()
    R.initialize()
    R.flush()
    R.Graph(name="digits_cnn_functional", algorithm="convolutional_neural_network", approach="distributed")
    record(epochs, X_train, X_test, y_train)
    print(R.activate())
    R.execute()
    R.track_progress()
    print(f"test accuracy: {accuracy(R.fetch_persisting_op('test_prediction'), y_test):.3f}")
