"""NeuralNetwork: a stack of layers with a loss, trained by `fit` (the original API's sequential model)."""
from collections import Counter
from typing import Any, Never, Optional, Sequence, Union

import ravop as R
from ravop.record.graph import current_graph

from . import loop_stopping, losses, nonfinite, traps
from .callbacks import Callback, checked, follow
from .fit import record_fit
from .fit_data import training_data
from .history import History
from .keras_habits import validation_loss
from .layers.base import as_input, name_layers
from .layers.base import Layer
from .losses import Loss
from .model_base import Model
from .optimizers import Optimizer
from .parallel_fit import record_parallel_fit
from .pipeline_stages import Units, layer_units


class NeuralNetwork(Model):
    """`NeuralNetwork(optimizer, loss='SquareLoss' | 'CrossEntropy', validation_data=None)`; `add` layers
    (named Dense_1, Dense_2, ... per type), then `fit`. `validation_data` is `(X_val, y_val)`."""

    def __init__(self, optimizer: Optimizer, loss: Union[str, Loss] = 'SquareLoss',
                 validation_data: Optional[Sequence[Any]] = None) -> None:
        super().__init__(optimizer)
        self.loss_function = losses.get(loss)
        if validation_data is not None and len(validation_data) != 2:
            raise ValueError("validation_data must be a pair (X_val, y_val)")
        self.validation_data = validation_data
        self.layers: list[Layer] = []
        self._type_counts: Counter[str] = Counter()

    def add(self, layer: Layer) -> None:
        kind = type(layer).__name__
        self._type_counts[kind] += 1
        name_layers(layer, f"{kind}_{self._type_counts[kind]}")
        self.layers.append(layer)

    def named_layers(self) -> list[tuple[Optional[str], Layer]]:
        return [(layer.name, layer) for layer in self.layers]

    def _forward_pass(self, X: Any, training: bool = True) -> Any:
        if not self.layers:
            raise ValueError("the model has no layers: add some with model.add(layer)")
        X = as_input(X)
        self._note_input(X)
        for layer in self.layers:
            X = layer._forward_pass(X, training=training)
        return X

    def train_on_batch(self, X: Any, y: Any) -> R.Op:
        """Record one training step on a batch; returns the loss Op (computed before the step)."""
        return self.train_step(X, y)

    def pipeline_units(self, sample: Any, rows: int) -> Units:
        """The units Pipeline cuts into stages (ravdl/v2/pipeline_stages.py): the layers in order, for
        micro-batches of `rows` rows (`sample`, one of them, is not needed to size layers)."""
        return layer_units(self, list(self.layers), rows)

    def predict(self, X: Any) -> Any:
        """The model's output for `X` in eval mode, as an Op (persist it to fetch it)."""
        return self._forward_pass(X, training=False)

    def test_on_batch(self, X: Any) -> Any:
        return self.predict(X)

    def fit(self, X: Any, y: Any = None, n_epochs: int = 1, batch_size: Optional[int] = None, shuffle: bool = False,
            seed: Optional[int] = None, save_model: Union[bool, str] = False, persist_weights: bool = False,
            strategy: Any = None, callbacks: Optional[Sequence[Callback]] = None,
            validation_data: Optional[Sequence[Any]] = None, **unexpected: Never) -> History:
        """Record `n_epochs` of training as one loop (ravdl.v2.fit): each batch loss is persisted as
        `training_loss_epoch_{e}_batch_{b}` (1-based; `ravop.core.loss_names`) and, with validation_data (X_val, y_val:
        fit's, as in Keras, else the constructor's), `validation_loss_epoch_{e}`.
        Shuffled batches draw their order from `seed` (default: the graph seed), so a run is reproducible.
        Returns a `History`: the training loss names in order, and `history.history['loss']`,
        `history.batch_losses` once the graph has run.

        After training, `save_model=True` (or a name) saves the model (`save_model`, default name "model") and
        `persist_weights=True` persists each layer's values (`persist_weights`), as the original's keywords.

        `strategy` (default: the graph's, `R.Graph(strategy=...)`): one of `R.parallel`'s, to train on several
        workers (ravdl.v2.parallel_fit).

        X, y: numpy arrays or torch tensors; or X a map-style torch Dataset of (x, y) items, or a DataLoader over
        one (its batch size and shuffling are used), read once and uploaded with the graph (ravdl.v2.fit_data).
        `callbacks`: ravdl.v2.callbacks (TensorBoard, CSVLogger, EarlyStopping, ...), fed while
        R.track_progress() follows the training."""
        traps.refuse_fit_keywords(self, unexpected)
        if not isinstance(save_model, (bool, str)) or not isinstance(persist_weights, bool):
            raise TypeError("save_model takes True, False or a name; persist_weights True or False")
        validation_pair = validation_data if validation_data is not None else self.validation_data
        validation = validation_loss(self, validation_pair)
        callbacks = checked(callbacks, validation=validation is not None)
        X, y, batch_size, shuffle = training_data(X, y, batch_size, shuffle)
        nonfinite.check_fit_data(2, X, y, validation_pair)
        graph = current_graph()
        seed = seed if seed is not None else graph.seed
        strategy = strategy if strategy is not None else graph.strategy
        if strategy is None:
            names: Sequence[str] = record_fit(self, self.train_on_batch, X, y, n_epochs, batch_size, shuffle, seed, validation,
                               loop_stopping.of(callbacks))
        elif validation is not None:
            raise NotImplementedError("validation_data with a parallel strategy is not implemented: evaluate the "
                                      "trained model with predict() after fit")
        else:
            names = record_parallel_fit(self, X, y, n_epochs, batch_size, shuffle, seed, strategy)
        if save_model:
            self.save_model(*(() if save_model is True else (save_model,)))
        if persist_weights:
            self.persist_weights()
        history = History(names, current_graph(), n_epochs, validation=validation is not None)
        follow(callbacks, self, history)
        return history
