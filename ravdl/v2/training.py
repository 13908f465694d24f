"""`fit` for the models that bring their own forward code (Functional, Pytorch_Model): the loss is given to
fit, then the training is recorded as NeuralNetwork.fit records it, one loop (ravdl.v2.fit) or a strategy's
segments (ravdl.v2.parallel_fit)."""
from typing import Any, Optional, Sequence, Union

from ravop.record.graph import current_graph

from . import loop_stopping, losses, nonfinite
from .losses import Loss
from .callbacks import Callback, checked, follow
from .fit import record_fit
from .fit_data import training_data
from .history import History
from .keras_habits import validation_loss
from .parallel_fit import record_parallel_fit


def fit_model(model: Any, X: Any, y: Any, n_epochs: int, batch_size: Optional[int], loss: Union[str, Loss],
              strategy: Any, shuffle: bool, seed: Optional[int], callbacks: Optional[Sequence[Callback]] = None,
              validation_data: Optional[Sequence[Any]] = None) -> History:
    """Record the training of `model` (the train-state interface of ravdl.v2.fit) with `loss` on data
    `ravdl.v2.fit_data` takes, with a validation loss per epoch on `validation_data` (X_val, y_val); returns a
    History, which `callbacks` follow as it trains."""
    validation = validation_loss(model, validation_data)
    callbacks = checked(callbacks, validation=validation is not None)
    X, y, batch_size, shuffle = training_data(X, y, batch_size, shuffle)
    nonfinite.check_fit_data(3, X, y, validation_data)   # fit_model is called by the model's fit
    model.loss_function = losses.get(loss)
    graph = current_graph()
    seed = seed if seed is not None else graph.seed
    strategy = strategy if strategy is not None else graph.strategy
    if strategy is None:
        names: Sequence[str] = record_fit(model, model.train_step, X, y, n_epochs, batch_size, shuffle, seed, validation,
                           loop_stopping.of(callbacks))
    elif validation is not None:
        raise NotImplementedError("validation_data with a parallel strategy is not implemented: evaluate the "
                                  "trained model with evaluate(X_val, y_val) after fit")
    else:
        names = record_parallel_fit(model, X, y, n_epochs, batch_size, shuffle, seed, strategy)
    history = History(names, graph, n_epochs, validation=validation is not None)
    follow(callbacks, model, history)
    return history
