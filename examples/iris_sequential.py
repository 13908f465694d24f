"""Iris classification with a sequential RavDL model, the original RavDL iris example script (iris
normalised, a third held out), trained through the engine.

Dense(15) -> BatchNormalization1D -> Dense(30) -> Dropout -> Dense(3) -> softmax, Adam, square loss on
one-hot labels, batches of 25. The script records the whole training run, runs it on workers, fetches the
test predictions and prints the test accuracy.

    python examples/iris_sequential.py [epochs]      (or RAVDL_EPOCHS; default 100)
"""
import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, BatchNormalization1D, Dense, Dropout
from ravdl.v2.optimizers import Adam

from example_data import accuracy, epochs_from_command_line, iris_data


def record(epochs, X_train, X_test, y_train):
    model = NeuralNetwork(optimizer=Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(15, input_shape=(4,)))
    model.add(BatchNormalization1D())
    model.add(Dense(30))
    model.add(Dropout(0.1))
    model.add(Dense(3))
    model.add(Activation("softmax"))
    model.summary()
    model.fit(X_train, y_train, n_epochs=epochs, batch_size=25)
    model.predict(X_test).persist_op(name="test_prediction")
    model.save_model("iris_model")
    return model


if __name__ == "__main__":
    epochs = epochs_from_command_line(100)
    X_train, X_test, y_train, y_test = iris_data()
    R.initialize()
    R.flush()
    R.Graph(name="iris_sequential", algorithm="neural_network", approach="distributed")
    record(epochs, X_train, X_test, y_train)
    print(R.activate())
    R.execute()
    R.track_progress()
    batches = -(-len(X_train) // 25)
    print("last training loss:", float(R.fetch_persisting_op(f"training_loss_epoch_{epochs}_batch_{batches}")))
    print(f"test accuracy: {accuracy(R.fetch_persisting_op('test_prediction'), y_test):.3f}")
