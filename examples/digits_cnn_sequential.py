"""Handwritten digits (sklearn's 8x8 digits) with a sequential RavDL CNN, trained through the engine.

Conv2D -> relu -> MaxPooling2D -> Dropout -> BatchNormalization2D -> Conv2D -> relu -> MaxPooling2D ->
Dropout -> BatchNormalization2D -> Flatten -> Dense(256) -> relu -> Dense(10) -> softmax, cross entropy,
Adam; 40% of the images held out for testing.

    python examples/digits_cnn_sequential.py [epochs]      (or RAVDL_EPOCHS; default 15)
"""
import torch

import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, BatchNormalization2D, Conv2D, Dense, Dropout, Flatten, MaxPooling2D
from ravdl.v2.optimizers import Adam

from example_data import accuracy, digits_data, epochs_from_command_line

BATCH_SIZE = 64


def untrained_model():
    """The untrained network (benchmarks/bench_contention.py trains the same one)."""
    network = NeuralNetwork(optimizer=Adam(lr=0.001), loss="CrossEntropy")
    network.add(Conv2D(1, 16, 3, padding="same", input_shape=(1, 8, 8)))
    network.add(Activation("relu"))
    network.add(MaxPooling2D(2))
    network.add(Dropout(0.1))
    network.add(BatchNormalization2D(16))
    network.add(Conv2D(16, 32, 3, padding="same"))
    network.add(Activation("relu"))
    network.add(MaxPooling2D(2))
    network.add(Dropout(0.1))
    network.add(BatchNormalization2D(32))
    network.add(Flatten())
    network.add(Dense(256))
    network.add(Activation("relu"))
    network.add(Dense(10))
    network.add(Activation("softmax"))
    return network


def record(epochs, X_train, X_test, y_train):
    model = untrained_model()
    model.summary()
    model.fit(X_train, y_train, n_epochs=epochs, batch_size=BATCH_SIZE, shuffle=True)
    model.predict(X_test).persist_op(name="test_prediction")
    model.save_model("digits_cnn")
    return model


if __name__ == "__main__":
    epochs = epochs_from_command_line(15)
    X_train, X_test, y_train, y_test = digits_data()
    R.initialize()
    R.flush()
    R.Graph(name="digits_cnn_sequential", algorithm="convolutional_neural_network", approach="distributed")
    record(epochs, X_train, X_test, y_train)
    print(R.activate())
    R.execute()
    R.track_progress()
    print(f"test accuracy: {accuracy(R.fetch_persisting_op('test_prediction'), y_test):.3f}")
    model = R.fetch_persisting_op("digits_cnn")   # the trained model, as a torch.nn.Module
    with torch.no_grad():
        print(f"saved model's test accuracy: {accuracy(model(torch.from_numpy(X_test)), y_test):.3f}")
