"""Functional: a model class the user writes, composing layers in its own forward code."""
from .layers.base import as_input, child_layers, name_layers
from .model_base import Model
from .pipeline_stages import called_chain, layer_units
from .training import fit_model


class Functional(Model):
    """Subclass it: create layers as attributes in `__init__`, call `self.initialize_params(optimizer)` at its
    end, and implement `_forward_pass_call(self, input, training=True)`. Train with
    `loss = R.square_loss(y, model._forward_pass(X))` and `model._backward_pass(loss)`.

    The layers trained are those held as attributes (also in lists, tuples and dicts, and inside
    CustomLayers) when `initialize_params` runs; they are named by attribute path, as torch names modules."""

    def __init__(self):
        super().__init__(None)
        self._layers = None

    def initialize_params(self, optimizer):
        self.optimizer = optimizer
        self._layers = [(attr, layer) for attr, layer in child_layers(self)]
        for attr, layer in self._layers:
            name_layers(layer, attr)

    def named_layers(self):
        if self._layers is None:
            raise ValueError(f"{type(self).__name__} must call self.initialize_params(optimizer) at the end of "
                             "__init__")
        return self._layers

    def _forward_pass(self, *inputs, training=True, **kwargs):
        """Run `_forward_pass_call` on the inputs (arrays made Ops); extra keywords (mask=, batch_size=)
        reach it as given, as in the original."""
        self.named_layers()
        inputs = [as_input(X) for X in inputs]
        if inputs:
            self._note_input(inputs[0])
        return self._forward_pass_call(*inputs, training=training, **kwargs)

    def fit(self, X, y=None, n_epochs=1, batch_size=None, loss=None, strategy=None, shuffle=False, seed=None,
            callbacks=None, validation_data=None):
        """Train on (X, y) as NeuralNetwork.fit does (one loop, losses persisted as
        `training_loss_epoch_{e}_batch_{b}`, 1-based), the forward being `_forward_pass_call(X)`: `loss` is
        'SquareLoss' (the default, unless compile() gave one), 'CrossEntropy' or a ravop loss
        `loss(y_true, y_pred)`; `validation_data=(X_val, y_val)` persists a validation loss per epoch; `strategy`
        (default: the graph's)
        one of R.parallel's. X may be a torch Dataset or DataLoader, and `callbacks` ravdl.v2.callbacks, as for
        NeuralNetwork.fit. Returns a `History`."""
        return fit_model(self, X, y, n_epochs, batch_size, loss or self.compiled_loss or "SquareLoss", strategy,
                         shuffle, seed, callbacks, validation_data)

    def pipeline_units(self, sample, rows):
        """The units Pipeline cuts into stages: the layers the forward calls, when they form a chain (checked by
        recording the forward once), for micro-batches of `rows` rows (ravdl/v2/pipeline_stages.py)."""
        return layer_units(self, called_chain(self, sample), rows)

    def _forward_pass_call(self, input, training=True):
        raise NotImplementedError(f"{type(self).__name__} must implement _forward_pass_call(self, input, "
                                  "training=True)")
