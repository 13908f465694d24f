"""Functional: a model class the user writes, composing layers in its own forward code."""
from typing import Any, Never, Optional, Sequence, Union

from . import traps
from .callbacks import Callback
from .history import History
from .layers.base import Layer, as_input, child_layers, name_layers
from .losses import Loss
from .optimizers import Optimizer
from .model_base import Model
from .pipeline_stages import Units, called_chain, layer_units
from .training import fit_model


class Functional(Model):
    """Subclass it: create layers as attributes in `__init__`, call `self.initialize_params(optimizer)` at its
    end, and implement `_forward_pass_call(self, input, training=True)`. Train with
    `loss = R.square_loss(y, model._forward_pass(X))` and `model._backward_pass(loss)`.

    The layers trained are those held as attributes (also in lists, tuples and dicts, and inside
    CustomLayers) when `initialize_params` runs; they are named by attribute path, as torch names modules."""

    def __init__(self) -> None:
        super().__init__(None)
        self._layers: Optional[list[tuple[str, Layer]]] = None

    def initialize_params(self, optimizer: Optimizer) -> None:
        traps.check_optimizer(optimizer, f"{type(self).__name__}.initialize_params(optimizer)")
        self.optimizer = optimizer
        self._layers = [(attr, layer) for attr, layer in child_layers(self)]
        for attr, layer in self._layers:
            name_layers(layer, attr)

    def named_layers(self) -> list[tuple[str, Layer]]:
        if self._layers is None:
            raise ValueError(f"{type(self).__name__} must call self.initialize_params(optimizer) at the end of "
                             "__init__")
        return self._layers

    def _forward_pass(self, *inputs: Any, training: bool = True, **kwargs: Any) -> Any:
        """Run `_forward_pass_call` on the inputs (arrays made Ops); extra keywords (mask=, batch_size=)
        reach it as given, as in the original."""
        self.named_layers()
        ops = [as_input(X) for X in inputs]
        if ops:
            self._note_input(ops[0])
        # a subclass's _forward_pass_call names its own inputs (one, or several)
        return self._forward_pass_call(*ops, training=training, **kwargs)  # type: ignore[misc, arg-type]

    def fit(self, X: Any, y: Any = None, n_epochs: int = 1, batch_size: Optional[int] = None,
            loss: Union[str, Loss, None] = None, strategy: Any = None, shuffle: bool = False,
            seed: Optional[int] = None, callbacks: Optional[Sequence[Callback]] = None,
            validation_data: Optional[Sequence[Any]] = None, **unexpected: Never) -> History:
        """Train on (X, y) as NeuralNetwork.fit does (one loop, losses persisted as
        `training_loss_epoch_{e}_batch_{b}`, 1-based), the forward being `_forward_pass_call(X)`: `loss` is
        'SquareLoss' (the default, unless compile() gave one), 'CrossEntropy' or a ravop loss
        `loss(y_true, y_pred)`; `validation_data=(X_val, y_val)` persists a validation loss per epoch; `strategy`
        (default: the graph's)
        one of R.parallel's. X may be a torch Dataset or DataLoader, and `callbacks` ravdl.v2.callbacks, as for
        NeuralNetwork.fit. Returns a `History`."""
        traps.refuse_fit_keywords(self, unexpected)
        return fit_model(self, X, y, n_epochs, batch_size, loss or self.compiled_loss or "SquareLoss", strategy,
                         shuffle, seed, callbacks, validation_data)

    def pipeline_units(self, sample: Any, rows: int) -> Units:
        """The units Pipeline cuts into stages: the layers the forward calls, when they form a chain (checked by
        recording the forward once), for micro-batches of `rows` rows (ravdl/v2/pipeline_stages.py)."""
        return layer_units(self, called_chain(self, sample), rows)

    def _forward_pass_call(self, input: Any, training: bool = True) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _forward_pass_call(self, input, "
                                  "training=True)")
