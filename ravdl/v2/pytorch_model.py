"""Pytorch_Model: train a PyTorch model, given as `R.model(...)`, through the engine.

    model = Pytorch_Model(model_op=R.model('net.pt'))
    model.initialize(Adam())
    loss = R.square_loss(y, model._forward_pass(X))
    model._backward_pass(loss)

The model's parameters and buffers are graph tensors, as a built-in layer's are: a forward pass records one
`torchscript_forward` op reading their current values (in training mode it also gives the updated buffers,
BatchNorm's running stats, which replace the old ones); `_backward_pass` records `R.grad` (the
`torchscript_vjp` op) and one optimizer step per trainable parameter (those with `requires_grad`).
`save_model(name)` persists the code and the current values; `R.fetch_persisting_op(name)` returns a
plain nn.Module with the trained weights under the original names (`ravop.client.saved_model.SavedModel`, built by
`ravop.record.torchscript_import.load_module`, so fetching needs only ravop).
"""
from functools import partial
from typing import Any, Never, NoReturn, Optional, Sequence, Union, cast

import ravop as R
from ravop.record.graph import current_graph
from ravop.record.torchscript_import import BLOB_KEY, BUNDLE_KIND, Model

from . import gradients, trained_values, traps
from .fit import LossTraining, Slot, TrainState, optimizer_slots
from .callbacks import Callback
from .history import History
from .keras_habits import KerasHabits
from .losses import Loss
from .optimizers import Optimizer
from .layers.base import as_input
from .pipeline_stages import Units, torch_units
from .training import fit_model


class Pytorch_Model(KerasHabits, LossTraining):
    def __init__(self, model_op: Model) -> None:
        if not isinstance(model_op, Model):
            raise TypeError(f"Pytorch_Model takes the model R.model(path_or_module) returns, not "
                            f"{type(model_op).__name__}")
        self.model = model_op
        self.optimizer: Optional[Optimizer] = None
        self.loss_function: Optional[Loss] = None  # loss(y_true, y_pred) -> Op, from fit(loss=...)
        self.graph: Optional[R.Graph] = None   # where the current values live, from the first forward pass
        self.params: list[R.Op] = []     # current parameter values (Ops), in the model's named_parameters() order
        self.buffers: list[R.Op] = []    # current buffer values (Ops), in named_buffers() order
        self._pending_grads: dict[Any, R.Op] = {}  # (self, parameter index) -> gradient summed since the last step

    def initialize(self, optimizer: Optimizer) -> None:
        """Train with `optimizer` (ravdl.v2.optimizers: Adam, AdamW or RMSprop)."""
        traps.check_optimizer(optimizer, "Pytorch_Model.initialize(optimizer)")
        self.optimizer = optimizer

    def _values_in_current_graph(self) -> R.Graph:
        graph = current_graph()
        if self.graph is None:
            self.params = [graph.constant(p) for p in self.model.params]
            self.buffers = [graph.constant(b) for b in self.model.buffers]
            self.graph = graph
        elif graph is not self.graph:   # trained in an earlier graph: continue from its values (read once)
            model = self.model
            self.params = [trained_values.here(p, f"parameter {n}") for p, n in zip(self.params, model.param_names)]
            self.buffers = [trained_values.here(b, f"buffer {n}") for b, n in zip(self.buffers, model.buffer_names)]
            self.graph = graph
        return graph

    def _forward_pass(self, X: Any, training: bool = True, **kwargs: Any) -> Any:
        """Record `model(X, **kwargs)` and return its output Op (a tuple of Ops if the model returns a
        tuple). `X` may be a tuple/list of positional inputs; keyword tensors (e.g. a padding mask) reach
        the model's forward by name."""
        self._values_in_current_graph()
        args = tuple(X) if isinstance(X, (tuple, list)) else (X,)
        out, buffers = self.model.forward(self.params, self.buffers, [as_input(a) for a in args],
                                          {k: as_input(v) for k, v in kwargs.items()}, training)
        self.buffers = list(buffers)
        return out

    def _backward_pass(self, loss: R.Op, step: bool = True) -> None:
        """Record the gradients of `loss` w.r.t. the trainable parameters; with `step=True` one optimizer
        step with them (plus any summed by earlier `step=False` calls), as torch accumulates `.grad`."""
        if self.optimizer is None:
            raise ValueError("Pytorch_Model has no optimizer: call initialize(optimizer) first")
        if self.graph is None:
            raise ValueError("run a forward pass before the backward pass")
        traps.softmax_before_cross_entropy(self, loss)
        trainable = [i for i, wanted in enumerate(self.model.requires_grad) if wanted]
        if not trainable:
            raise ValueError("the model has no parameter with requires_grad=True")
        gradients.backward(loss, [(self, i) for i in trainable], self._pending_grads, self.optimizer, step)

    # ------------------------------------------------------------------ the train-state interface (fit.py)

    def train_state(self, X: R.Op) -> TrainState:
        """The `TrainState` of training: the trainable parameters (frozen ones are read, never replaced, so
        nothing carries them), the buffers and the optimizer's state."""
        self._values_in_current_graph()
        if self.optimizer is None:
            raise ValueError("Pytorch_Model has no optimizer: call initialize(optimizer) first")
        if self._pending_grads:
            raise ValueError("gradients summed by _backward_pass(loss, step=False) are waiting for a step: "
                             "finish them with a step=True backward pass before fit")
        self.params, self.buffers = list(self.params), list(self.buffers)
        trained = self._trained()
        optimizer, steps = optimizer_slots(self.optimizer, trained)
        return TrainState(params=[Slot(partial(getattr, self, "params"), i) for (_, i), _ in trained],
                          buffers=[Slot(partial(getattr, self, "buffers"), i) for i in range(len(self.buffers))],
                          optimizer=optimizer, counters=steps)

    def apply_gradients(self, grads: Sequence[R.Op]) -> None:
        """Record one optimizer step per trainable parameter (`train_state(...).params` order) with `grads`."""
        for (key, param), grad in zip(self._trained(), grads):
            self.params[key[1]] = cast(Optimizer, self.optimizer).update(key, param, grad)

    def pipeline_units(self, sample: Any, rows: int) -> Units:
        """The units Pipeline cuts into stages: the model's top-level children, when its forward is a chain of
        them (checked), else pieces of its module's torch.fx graph, each measured on `sample`, a micro-batch of `rows`
        rows (ravop.record.torchscript_stages, ravop.record.graph_stages)."""
        return torch_units(self, sample)

    def _trained(self) -> list[tuple[tuple["Pytorch_Model", int], R.Op]]:
        return [((self, i), self.params[i]) for i, wanted in enumerate(self.model.requires_grad) if wanted]

    def fit(self, X: Any, y: Any = None, n_epochs: int = 1, batch_size: Optional[int] = None,
            loss: Union[str, Loss, None] = None, strategy: Any = None, shuffle: bool = False,
            seed: Optional[int] = None, callbacks: Optional[Sequence[Callback]] = None,
            validation_data: Optional[Sequence[Any]] = None, **unexpected: Never) -> History:
        """Train the model on (X, y) for `n_epochs` in batches of `batch_size`, as NeuralNetwork.fit does
        (one loop, losses persisted as `training_loss_epoch_{e}_batch_{b}`, 1-based): `loss` is
        'CrossEntropy' (class indices, or one-hot rows; the default, unless compile() gave one), 'SquareLoss',
        or a ravop loss `loss(y_true, y_pred)`; `validation_data=(X_val, y_val)` persists a validation loss per
        epoch;
        `strategy` (default: the graph's) one of R.parallel's. X may be a torch Dataset or DataLoader, and
        `callbacks` ravdl.v2.callbacks, as for NeuralNetwork.fit. Returns a `History`."""
        traps.refuse_fit_keywords(self, unexpected)
        return fit_model(self, X, y, n_epochs, batch_size, loss or self.compiled_loss or "CrossEntropy", strategy,
                         shuffle, seed, callbacks, validation_data)

    def __getstate__(self) -> NoReturn:
        raise TypeError("a Pytorch_Model is not pickled (its code is a TorchScript module): call "
                        "model.save_model(name) before R.activate(); once the graph ran, R.fetch_persisting_op(name) "
                        "returns a torch.nn.Module with the trained values (torch.save its state_dict). In this "
                        "process the model itself goes on in the next graph from them")

    def save(self, path: str) -> NoReturn:
        """Keras' `model.save(path)`, refused with the way to keep a Pytorch_Model."""
        raise NotImplementedError(
            "Pytorch_Model.save(path) is not implemented (NeuralNetwork and Functional have it): call "
            "model.save_model(name) before R.activate(); once the graph ran, R.fetch_persisting_op(name) returns "
            "a torch.nn.Module (torch.save its state_dict), or run `ravop fetch GRAPH name -o model.pt`")

    def save_model(self, name: str) -> None:
        """Persist the model under `name`: its code and current parameter and buffer values."""
        graph = self._values_in_current_graph()
        model = self.model
        tensors = {BLOB_KEY: model.blob_op(graph), **dict(zip(model.param_names, self.params)),
                   **dict(zip(model.buffer_names, self.buffers))}
        spec = {"model_hash": model.model_hash, "param_slots": [list(s) for s in model.param_slots],
                "buffer_slots": [list(s) for s in model.buffer_slots], "requires_grad": list(model.requires_grad)}
        graph.save_bundle(name, BUNDLE_KIND, spec, tensors)
