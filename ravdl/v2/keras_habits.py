"""What a Keras user reaches for on any ravdl model (NeuralNetwork, Functional, Pytorch_Model), each either
a thin equivalent that does what Keras' does, lazily as everything here, or a clear error pointing at the
ravdl way: compile (the optimizer and loss, no metrics), predict and evaluate (Ops, to persist and fetch),
and fit's validation_data (`save(path)` is each model kind's own: ravdl.v2.model_file, or Pytorch_Model's refusal)."""
from typing import Any, Callable, Optional, Sequence, Union

import ravop as R

from . import losses, traps
from .layers.base import as_input
from .losses import Loss
from .optimizers import Optimizer


class KerasHabits:
    """Mixed into every model kind; `loss_function`, `optimizer` and `_forward_pass` are the model's."""

    compiled_loss: Optional[Loss] = None   # compile(loss=...), used by a later fit(...) that gives no loss
    # the model's own, declared for the type checker
    loss_function: Optional[Loss]
    optimizer: Optional[Optimizer]
    _forward_pass: Callable[..., Any]

    def compile(self, optimizer: Optional[Optimizer] = None, loss: Union[str, Loss, None] = None, metrics: Any = None,
                **unsupported: Any) -> Any:
        """Keras' compile: set the optimizer (a ravdl.v2.optimizers instance) and the loss ('SquareLoss',
        'CrossEntropy' or a ravop loss(y_true, y_pred)) that fit uses. Returns the model."""
        if unsupported:
            raise TypeError(f"compile() takes optimizer=, loss= and metrics=; ravdl has no "
                            f"{', '.join(sorted(unsupported))}")
        if metrics:
            raise NotImplementedError("compile(metrics=...) is not implemented: fit persists losses only; compute "
                                      "a metric from a persisted model.predict(X) after the graph ran")
        if optimizer is not None:
            traps.check_optimizer(optimizer, "compile(optimizer=)")
            self.optimizer = optimizer
        if loss is not None:
            self.compiled_loss = self.loss_function = losses.get(loss)
        return self

    def predict(self, X: Any) -> Any:
        """The model's output for `X` in eval mode, as an Op: persist it (`.persist_op(name)`) to fetch it
        after R.activate(), R.execute() and R.track_progress(); np.asarray() takes the fetched value."""
        return self._forward_pass(X, training=False)

    def evaluate(self, X: Any, y: Any, loss: Union[str, Loss, None] = None) -> R.Op:
        """Keras' evaluate, lazily: the loss (default: the model's) of an eval-mode forward pass of all of `X`
        against `y`, as a scalar Op to persist and fetch once the graph ran."""
        loss_function = losses.get(loss) if loss is not None else self.loss_function
        if loss_function is None:
            raise ValueError(f"{type(self).__name__} has no loss yet: give evaluate(X, y, loss=...) or "
                             "compile(loss=...)")
        return loss_function(as_input(y), self.predict(X))


def validation_loss(model: Any, validation_data: Optional[Sequence[Any]]) -> Optional[Callable[[], R.Op]]:
    """A `validation() -> loss Op` of `model` in eval mode on fit's validation_data=(X_val, y_val), or None."""
    if validation_data is None:
        return None
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
        raise ValueError("validation_data must be a pair (X_val, y_val)")
    X_val, y_val = as_input(validation_data[0]), as_input(validation_data[1])
    return lambda: model.loss_function(y_val, model._forward_pass(X_val, training=False))
