"""NeuralNetwork: a stack of layers with a loss, trained by `fit` (the original API's sequential model)."""
from collections import Counter

import numpy as np

from ravop.graph import current_graph

from . import losses
from .layers.base import as_input, name_layers
from .model import Model
from .utils import batch_iterator


class NeuralNetwork(Model):
    """`NeuralNetwork(optimizer, loss='SquareLoss' | 'CrossEntropy', validation_data=None)`; `add` layers
    (named Dense_1, Dense_2, ... per type), then `fit`. `validation_data` is `(X_val, y_val)`."""

    def __init__(self, optimizer, loss='SquareLoss', validation_data=None):
        super().__init__(optimizer)
        self.loss_function = losses.get(loss)
        if validation_data is not None and len(validation_data) != 2:
            raise ValueError("validation_data must be a pair (X_val, y_val)")
        self.validation_data = validation_data
        self.layers = []
        self._type_counts = Counter()

    def add(self, layer):
        kind = type(layer).__name__
        self._type_counts[kind] += 1
        name_layers(layer, f"{kind}_{self._type_counts[kind]}")
        self.layers.append(layer)

    def named_layers(self):
        return [(layer.name, layer) for layer in self.layers]

    def _forward_pass(self, X, training=True):
        if not self.layers:
            raise ValueError("the model has no layers: add some with model.add(layer)")
        X = as_input(X)
        self._note_input(X)
        for layer in self.layers:
            X = layer._forward_pass(X, training=training)
        return X

    def train_on_batch(self, X, y):
        """Record one training step on a batch; returns the loss Op (computed before the step)."""
        loss = self.loss_function(as_input(y), self._forward_pass(X, training=True))
        self._backward_pass(loss)
        return loss

    def predict(self, X):
        """The model's output for `X` in eval mode, as an Op (persist it to fetch it)."""
        return self._forward_pass(X, training=False)

    def test_on_batch(self, X):
        return self.predict(X)

    def fit(self, X, y, n_epochs, batch_size, shuffle=False, seed=None, save_model=False, persist_weights=False):
        """Record `n_epochs` of training; persists each batch loss as `training_loss_epoch_{e}_batch_{b}` (1-based)
        and, with validation_data, `validation_loss_epoch_{e}`. Shuffled batches draw their order from `seed`
        (default: the graph seed), so a run is reproducible. Returns the per-batch loss Ops in order.

        After training, `save_model=True` (or a name) saves the model (`save_model`, default name "model") and
        `persist_weights=True` persists each layer's values (`persist_weights`), as the original's keywords."""
        if not isinstance(save_model, (bool, str)) or not isinstance(persist_weights, bool):
            raise TypeError("save_model takes True, False or a name; persist_weights True or False")
        X_val = y_val = None
        if self.validation_data is not None:
            X_val, y_val = as_input(self.validation_data[0]), as_input(self.validation_data[1])
        rng = None
        if shuffle:
            rng = np.random.default_rng(seed if seed is not None else current_graph().seed)
        history = []
        for epoch in range(1, n_epochs + 1):
            batches = batch_iterator(X, y, batch_size=batch_size, shuffle=shuffle, seed=rng)
            for batch, (X_batch, y_batch) in enumerate(batches, start=1):
                loss = self.train_on_batch(X_batch, y_batch)
                loss.persist_op(f"training_loss_epoch_{epoch}_batch_{batch}")
                history.append(loss)
            if X_val is not None:
                self.loss_function(y_val, self.predict(X_val)).persist_op(f"validation_loss_epoch_{epoch}")
        if save_model:
            self.save_model(*(() if save_model is True else (save_model,)))
        if persist_weights:
            self.persist_weights()
        return history
