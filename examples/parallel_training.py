"""One model trained by several workers (R.parallel): a digits MLP (64 - 128 - relu - 10, Adam, cross entropy,
batches of 32) trained with LocalSGD (two replicas on the two halves of the data, averaged every 8 steps),
DataParallel (two replicas per batch, the same numbers as one worker), Gossip (four replicas averaging in
seeded pairs) and DiLoCo (four replicas meeting every 8 steps, where an outer Nesterov SGD steps the global model
with their int8-compressed pseudo-gradients), each on the embedded engine's two workers; prints each run's
forecast of which worker takes which replica, and its test accuracy.

    python examples/parallel_training.py [epochs]      (or RAVDL_EPOCHS; default 20)
"""
import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam

from example_data import accuracy, digits_data, epochs_from_command_line

STRATEGIES = {"LocalSGD": R.parallel.LocalSGD(replicas=2, sync_every=8),
              "DataParallel": R.parallel.DataParallel(replicas=2),
              "Gossip": R.parallel.Gossip(replicas=4, interpolation="loss"),
              "DiLoCo": R.parallel.DiLoCo(replicas=4, inner_steps=8, compression="int8")}


def train(name, strategy, epochs, X_train, X_test, y_train):
    R.Graph(name=f"digits {name}", seed=0, strategy=strategy)
    model = NeuralNetwork(optimizer=Adam(lr=0.003), loss="CrossEntropy")
    model.add(Dense(128, input_shape=(64,)))
    model.add(Activation("relu"))
    model.add(Dense(10))
    model.fit(X_train, y_train, n_epochs=epochs, batch_size=32, shuffle=True)
    model.predict(X_test).persist_op(name="test_prediction")
    model.save_model(f"digits_{name}")
    print(R.activate())
    R.execute()
    R.track_progress()
    return R.fetch_persisting_op("test_prediction")


if __name__ == "__main__":
    epochs = epochs_from_command_line(20)
    X_train, X_test, y_train, y_test = digits_data()
    X_train, X_test = X_train.reshape(len(X_train), -1), X_test.reshape(len(X_test), -1)
    X_train, y_train = X_train[:len(X_train) // 4 * 4], y_train[:len(y_train) // 4 * 4]   # equal shards for 4
    R.initialize(workers=2)
    R.flush()
    for name, strategy in STRATEGIES.items():
        print(f"{name} test accuracy: {accuracy(train(name, strategy, epochs, X_train, X_test, y_train), y_test):.3f}")
