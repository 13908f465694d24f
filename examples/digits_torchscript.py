"""Handwritten digits with a CNN written in PyTorch, saved as a TorchScript file and trained through the
engine with Pytorch_Model; the trained model comes back as a plain nn.Module.

The CNN (Conv2d -> relu -> max-pool -> Dropout -> BatchNorm2d, twice, then Linear(256) -> relu -> Linear(10))
is scripted to a .pt file in a temporary directory, as a user who already has a model file would start.
Cross-entropy loss, Adam; sklearn's 8x8 digits with 40% held out for testing. At the end the fetched
module's accuracy on the test split is compared with the accuracy of the prediction the graph persisted.

    python examples/digits_torchscript.py [epochs]      (or RAVDL_EPOCHS; default 15)
"""
import os
import tempfile

import numpy as np
import torch
from torch import nn

import ravop as R
from ravdl.v2 import Pytorch_Model
from ravdl.v2.optimizers import Adam
from ravdl.v2.utils import batch_iterator

from example_data import accuracy, digits_data, epochs_from_command_line

BATCH_SIZE = 64


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.1), nn.BatchNorm2d(16),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.1), nn.BatchNorm2d(32))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 2 * 2, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def record(model_path, epochs, X_train, X_test, y_train):
    model = Pytorch_Model(model_op=R.model(model_path))
    model.initialize(Adam(lr=0.001))
    rng = np.random.default_rng(0)
    for epoch in range(1, epochs + 1):
        for batch, (X_batch, y_batch) in enumerate(batch_iterator(X_train, y_train, BATCH_SIZE, shuffle=True,
                                                                  seed=rng), start=1):
            out = model._forward_pass(R.t(X_batch))
            loss = R.cross_entropy_loss(R.t(y_batch), out)
            model._backward_pass(loss, step=True)
            loss.persist_op(f"training_loss_epoch_{epoch}_batch_{batch}")
    model._forward_pass(R.t(X_test), training=False).persist_op("test_prediction")
    model.save_model("my_net")
    return model


if __name__ == "__main__":
    epochs = epochs_from_command_line(15)
    X_train, X_test, y_train, y_test = digits_data()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "digits_cnn.pt")
        torch.jit.save(torch.jit.script(DigitsCNN()), path)
        R.initialize()
        R.flush()
        R.Graph(name="digits_torchscript", algorithm="convolutional_neural_network", approach="distributed")
        record(path, epochs, X_train, X_test, y_train)
    print(R.activate())
    R.execute()
    R.track_progress()
    print(f"final training loss: {float(R.fetch_persisting_op(f'training_loss_epoch_{epochs}_batch_1')):.4f}")
    print(f"test accuracy: {accuracy(R.fetch_persisting_op('test_prediction'), y_test):.3f}")
    my_net = R.fetch_persisting_op("my_net")   # an nn.Module with the trained weights
    my_net.eval()
    with torch.no_grad():
        print(f"saved model's test accuracy: {accuracy(my_net(torch.from_numpy(X_test)), y_test):.3f}")
