"""What NeuralNetwork and Functional share: the layers they hold, the backward pass that records gradients
and optimizer steps, the summary table, and saving.

`_backward_pass(loss)` records `R.grad(loss, parameters)` and, per parameter, one optimizer step op; each
layer then holds the step's output as its parameter. With `step=False` the gradients are only summed, as
torch accumulates `.grad` over backward calls, and the next `step=True` applies the sum.
"""
from functools import partial
from typing import Any, Iterator, Optional, Sequence, cast

import torch

import ravop as R
from ravop.record.graph import current_graph

from . import export, gradients, model_file, onnx_export, traps
from .fit import LossTraining, Slot, TrainState, optimizer_slots
from .keras_habits import KerasHabits
from .layers.base import CustomLayer, Layer, Shape, leaf_layers
from .losses import Loss
from .notebook import Summary, in_notebook
from .optimizers import Optimizer
from .pipeline_stages import Units


class Model(KerasHabits, LossTraining):
    def __init__(self, optimizer: Optional[Optimizer] = None) -> None:
        traps.check_optimizer(optimizer, f"{type(self).__name__}(optimizer=)")
        self.optimizer = optimizer
        # loss(y_true, y_pred) -> Op: NeuralNetwork's, or the one given to fit
        self.loss_function: Optional[Loss] = None
        # (layer, parameter name) -> gradient Op summed since the last step
        self._pending_grads: dict[Any, R.Op] = {}
        # (shape without the batch dimension, dtype) of the first input seen
        self.input_spec: Optional[tuple[Shape, Any]] = None
        self.saved_as: Optional[str] = None       # the name save_model persisted the model under

    def __getstate__(self) -> dict[str, Any]:
        """`pickle.dump(model, f)`, as the original's scripts did: the model's structure (layers, their
        configuration and shapes, the optimizer's settings, the name it was saved under), not graph values."""
        return {**vars(self), "_pending_grads": {}}

    def named_layers(self) -> Sequence[tuple[Any, Layer]]:
        """(name, layer) of the model's top-level layers, in order."""
        raise NotImplementedError

    def leaf_layers(self) -> Iterator[tuple[Optional[str], Layer]]:
        """(name, built-in layer) of every layer, CustomLayers expanded into their sub-layers."""
        for _, layer in self.named_layers():
            yield from leaf_layers(layer)

    def _note_input(self, X: R.Op) -> None:
        if self.input_spec is None:
            # Floating data reaches the layers as float32 (they cast it), so a saved model takes float32.
            dtype = torch.float32 if X.dtype.is_floating_point else X.dtype
            self.input_spec = (tuple(X.shape[1:]), dtype)

    def _backward_pass(self, loss: R.Op, step: bool = True) -> None:
        """Record the gradients of `loss` w.r.t. every parameter, and with `step=True` one optimizer step."""
        if self.optimizer is None:
            raise ValueError(f"{type(self).__name__} has no optimizer: Functional models call "
                             "self.initialize_params(optimizer) at the end of __init__")
        traps.softmax_before_cross_entropy(self, loss)
        slots = [(layer, name) for _, layer in self.leaf_layers() if layer.built for name in layer.params]
        if not slots:
            raise ValueError("the model has no built parameters: run a forward pass before the backward pass")
        gradients.backward(loss, slots, self._pending_grads, self.optimizer, step)

    # ------------------------------------------------------------------ the train-state interface (fit.py)

    def train_state(self, X: R.Op) -> TrainState:
        """The `TrainState` of training on data like `X` (an Op). Layers not built yet are built first from one
        row of `X`: a loop step must read parameters that exist before it (the eval-mode pass recorded for that
        is read by nothing, so it is never run); layers trained in an earlier graph enter this one the same way,
        with their trained values."""
        if not all(layer.graph is X.graph for _, layer in self.leaf_layers()):
            self._forward_pass(X[0:1], training=False)
        if self.optimizer is None:
            raise ValueError(f"{type(self).__name__} has no optimizer to train with")
        if self._pending_grads:
            raise ValueError("gradients summed by _backward_pass(loss, step=False) are waiting for a step: "
                             "finish them with a step=True backward pass before fit")
        trained = self._trained()
        optimizer, steps = optimizer_slots(self.optimizer, trained)
        return TrainState(
            params=[Slot(partial(getattr, layer, "params"), name) for (layer, name), _ in trained],
            buffers=[Slot(partial(getattr, layer, "buffers"), name) for _, layer in self.leaf_layers()
                     for name in layer.buffers],
            optimizer=optimizer,
            counters=steps + [Slot(partial(vars, layer), "batches_tracked") for _, layer in self.leaf_layers()
                              if hasattr(layer, "batches_tracked")])

    def apply_gradients(self, grads: Sequence[R.Op]) -> None:
        """Record one optimizer step per trained parameter (`train_state(...).params` order) with `grads`."""
        for ((layer, name), param), grad in zip(self._trained(), grads):
            layer.params[name] = cast(Optimizer, self.optimizer).update((layer, name), param, grad)

    def pipeline_units(self, sample: Any, rows: int) -> Units:
        """The units Pipeline cuts into stages, in forward order (ravdl/v2/pipeline_stages.py); NeuralNetwork and
        Functional give theirs."""
        raise NotImplementedError(f"Pipeline cuts a model into stages of its layers in forward order, which a "
                                  f"{type(self).__name__} does not give (pipeline_units): use NeuralNetwork, a "
                                  "Functional, or another strategy")

    def _trained(self) -> list[tuple[tuple[Layer, str], R.Op]]:
        return [((layer, name), layer.params[name]) for _, layer in self.leaf_layers() if layer.built
                for name in layer.params]

    def parameter_count(self) -> int:
        """Trainable parameters, counted as torch's `sum(p.numel() for p in model.parameters())`."""
        return sum(count for _, _, _, count in self._summary_rows())

    def summary(self) -> None:
        """Show a table of the layers: name, type, output shape (None is the batch dimension), parameters; printed
        as text, or displayed as an HTML table in a Jupyter notebook (`Summary`)."""
        table = self.summary_table()
        if in_notebook():
            from IPython.display import display
            display(table)
        else:
            print(table)

    def summary_table(self) -> Summary:
        """The `Summary` that summary() shows."""
        rows = [(name, kind, "(None" + "".join(f", {d}" for d in shape) + ")", f"{count:,}")
                for name, kind, shape, count in self._summary_rows()]
        return Summary(rows, self.parameter_count())

    def _summary_rows(self) -> list[tuple[Optional[str], str, Shape, int]]:
        """(name, type, output shape, parameter count) per built-in layer; a layer's input shape is its own
        (declared or learnt at its first forward pass), else the previous layer's output shape."""
        rows: list[tuple[Optional[str], str, Shape, int]] = []
        shape: Optional[Shape] = None
        for _, top in self.named_layers():
            if isinstance(top, CustomLayer) and any(layer.input_shape is None for _, layer in leaf_layers(top)):
                raise ValueError(f"{top.label} has not been built: run a forward pass first (its sub-layers learn "
                                 "their shapes from their first input)")
            for name, layer in leaf_layers(top):
                in_shape = layer.input_shape or shape
                if in_shape is None:
                    raise ValueError(f"the input shape of {name} is unknown: give the first layer input_shape=(...) "
                                     "or run a forward pass first")
                shape = layer.output_shape(in_shape)
                rows.append((name, type(layer).__name__, shape, layer.parameter_count(in_shape)))
        return rows

    def save_model(self, name: str = "model") -> None:
        """Persist the trained model under `name`: `R.fetch_persisting_op(name)` returns it as a TorchScript-able
        torch.nn.Module with the trained weights, computing what `predict` computes."""
        export.save(self, name)
        self.saved_as = name

    def save(self, path: str) -> None:
        """Write the model with its current values to `path`, once the graph that trained it has run;
        `ravdl.v2.load_model(path)` gives it back, in any later session (ravdl.v2.model_file)."""
        model_file.save(self, path)

    def persist_weights(self) -> None:
        """Persist every layer's current values, each under its torch state_dict key ("Dense_1.weight",
        "BatchNormalization1D_1.running_mean"), to fetch as tensors."""
        for layer_name, layer in self.leaf_layers():
            if layer.graph is not current_graph() and (layer.built or layer.places is not None):
                layer.enter(cast(Shape, layer.input_shape))   # values of an earlier graph are persisted here
            for key, op in layer.state().items():
                op.persist_op(f"{layer_name}.{key}")

    def get_onnx_model(self, name: str) -> str:
        """Write the saved model to `{name}.onnx` (torch.onnx) and return its path; the model must have been
        saved (`fit(..., save_model=True)` or `save_model(...)`) in a graph that has run. Works on a model
        unpickled in a later process, as the original's did."""
        if self.saved_as is None:
            raise ValueError("get_onnx_model needs the trained values: save the model before R.activate() "
                             "(fit(..., save_model=True) or model.save_model(name)) and run the graph")
        return onnx_export.write(R.fetch_persisting_op(self.saved_as), export.input_spec(self), f"{name}.onnx")
