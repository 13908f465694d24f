"""What every layer is: its configuration, and once built, its parameters and state as Ops of one graph.

A layer holds no tensors of its own. Building it (at its first forward pass, when the input shape is known)
uploads its initial values as constants; a training step then records ops that read the current values and
produce new ones, and the layer (or the optimizer) replaces its Ops with the new ones. So the whole training
run is one dataflow graph that any worker can execute.

A built-in layer defines:
- `param_shapes(input_shape)`: its trainable parameters, named and shaped as in the torch module;
- `initial_values(input_shape, generator)`: `(params, buffers)`, dicts of name -> tensor;
- `output_shape(input_shape)`; shapes here exclude the batch dimension;
- `forward(X, training)`: records its ops and returns the output Op;
- `torch_spec()`: `(torch.nn class name, constructor kwargs)` of the equivalent torch module.
"""
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence, Union, cast

import numpy as np
import torch

import ravop as R
from ravop.core import registry
from ravop.core.sizes import numel
from ravop.ops.rules import Like
from ravop.record.graph import Op, current_graph

from .. import trained_values
from ..trained_values import Place
from . import init

Shape = tuple[int, ...]     # a value's shape without the batch dimension
Flag = Union[bool, str]     # a boolean option: the original API also took the strings 'True' and 'False'
Call = tuple["Layer", R.Op, Any]   # (layer, its input, its output: an Op or a tuple of Ops)

# inside `recording_calls`: the (layer, input, output) of every built-in layer call
_calls: Optional[list[Call]] = None


def shape_by_rule(op_function: Callable[..., Any], input_shape: Sequence[int], *others: Any,
                  dtype: Any = torch.float32, **params: Any) -> Shape:
    """The output shape (no batch dimension) of the op that `op_function` (`R.<op>`, the function the layer records
    with) records, applied to an input of `input_shape` and `dtype` and to `others` (`ravop.ops.rules.Like`s of its
    other inputs), by the op's own shape rule, so that a layer's summary and the graph it records cannot disagree. A
    multi-output op gives its first output's shape."""
    rule = cast(Callable[..., Any], registry.get(op_function.__name__).shape)   # every op a layer applies has one
    out = rule(Like((1,) + tuple(input_shape), dtype), *others, **params)
    shape = out[0][0] if isinstance(out, list) else out[0]
    return tuple(shape[1:])


class Layer:
    input_dtype: Any = torch.float32   # what the layer casts its input to (None: takes it as it is)
    # A built-in layer's own (see the module docstring); declared here for the type checker only.
    forward: Callable[..., Any]
    torch_spec: Callable[[], Any]

    def __init__(self, input_shape: Union[int, Sequence[int], None] = None) -> None:
        self.input_shape: Optional[Shape] = None if input_shape is None else _shape(input_shape)
        self.name: Optional[str] = None          # given by the model that holds the layer
        self.params: dict[str, R.Op] = {}        # torch parameter name -> Op holding its current value
        self.buffers: dict[str, R.Op] = {}       # torch buffer name -> Op (state the forward pass moves: running stats)
        self.graph: Optional[R.Graph] = None     # where the values live, once built
        # (params, buffers) where an unpickled layer's trained values are (ravdl.v2.trained_values)
        self.places: Optional[tuple[dict[str, Place], dict[str, Place]]] = None
        self.last_output_shape: Optional[Shape] = None

    @property
    def built(self) -> bool:
        return self.graph is not None

    def __getstate__(self) -> dict[str, Any]:
        """A pickled layer keeps its configuration, learnt input shape and where its values are (tensors, or
        references to the store: `ravdl.v2.trained_values`), not the Ops of a graph: unpickled in a later
        session, it starts from its trained values, never from fresh random ones."""
        places = self.places if self.graph is None else self._places()
        return {**vars(self), "params": {}, "buffers": {}, "graph": None, "places": places}

    def _places(self) -> tuple[dict[str, Place], dict[str, Place]]:
        return ({k: trained_values.place_of(op, f"{self.label}.{k}") for k, op in self.params.items()},
                {k: trained_values.place_of(op, f"{self.label}.{k}") for k, op in self.buffers.items()})

    def _forward_pass(self, X: Any, training: bool = True) -> Any:
        X = self.cast_input(as_input(X))
        if self.graph is not X.graph:
            self.enter(tuple(X.shape[1:]))
        out = self.forward(X, training)
        self.last_output_shape = tuple((out[0] if isinstance(out, tuple) else out).shape[1:])
        if _calls is not None:
            _calls.append((self, X, out))
        return out

    def enter(self, input_shape: Shape) -> None:
        """Give the layer its values in the current graph: drawn at random the first time (`build`), else the
        values it had at the end of the graph it was in (or was unpickled with), read once (a graph that has not
        run, or values no one persisted, raise GraphStateError naming what to do)."""
        values = (self.params, self.buffers) if self.graph is not None else self.places
        if values is None:
            self.build(input_shape)
            return
        params, buffers = values
        self.params = {k: trained_values.here(value, f"{self.label}.{k}") for k, value in params.items()}
        self.buffers = {k: trained_values.here(value, f"{self.label}.{k}") for k, value in buffers.items()}
        self.graph, self.places = current_graph(), None

    def cast_input(self, X: R.Op) -> R.Op:
        """The input in the layer's dtype: as in the original, layers compute in float32 whatever the
        dtype of the data (`R.t` of a float64 array stays float64)."""
        if self.input_dtype is None or X.dtype == self.input_dtype:
            return X
        return R.cast(X, self.input_dtype)

    def build(self, input_shape: Shape) -> None:
        """Upload the initial values into the current graph, drawn for `input_shape` (no batch dimension).
        A declared input_shape may name only the trailing dimensions, as the original's did: Dense(n,
        input_shape=(d,)) takes (batch, d) and (batch, seq, d)."""
        declared = self.input_shape
        if declared is not None and tuple(input_shape[len(input_shape) - len(declared):]) != declared:
            raise ValueError(f"layer {self.label} was declared with input_shape={self.input_shape}, "
                             f"but its input has shape {input_shape} (without the batch dimension)")
        graph = current_graph()
        params, buffers = self.initial_values(input_shape, init.layer_generator(graph))
        self.input_shape = input_shape
        self.params = {name: R.t(value) for name, value in params.items()}
        self.buffers = {name: R.t(value) for name, value in buffers.items()}
        self.graph = graph

    def parameter_count(self, input_shape: Shape) -> int:
        return sum(numel(shape) for shape in self.param_shapes(input_shape).values())

    def state(self) -> dict[str, R.Op]:
        """Every current value by its torch state_dict name: parameters, then buffers."""
        return {**self.params, **self.buffers}

    def torch_extra_state(self) -> dict[str, Any]:
        """State of the torch module that is not a graph tensor (e.g. BatchNorm's batch count)."""
        return {}

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        return {}

    def initial_values(self, input_shape: Shape, generator: torch.Generator
                       ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return {}, {}

    def output_shape(self, input_shape: Shape) -> Shape:
        return input_shape

    @property
    def label(self) -> str:
        return self.name or type(self).__name__


class CustomLayer(Layer):
    """A layer made of other layers: subclass it, create the sub-layers as attributes in `__init__` and
    implement `_forward_pass_call(self, input, training=True)`. Sub-layers are found as attributes (also
    inside lists, tuples and dicts), in the order they were set."""

    def _forward_pass(self, *inputs: Any, training: bool = True, **kwargs: Any) -> Any:
        """Inputs (several, as an attention layer's q, k, v) and keywords (mask=, batch_size=) go to
        `_forward_pass_call` as given, arrays made Ops."""
        # a subclass's _forward_pass_call names its own inputs (one, or several as q, k, v)
        return self._forward_pass_call(
            *(as_input(X) for X in inputs), training=training, **kwargs)  # type: ignore[misc, arg-type]

    def _forward_pass_call(self, input: R.Op, training: bool = True) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _forward_pass_call(self, input, "
                                  "training=True)")

    @property
    def built(self) -> bool:
        return all(layer.built for _, layer in leaf_layers(self))


def child_layers(owner: object) -> Iterator[tuple[str, Layer]]:
    """(attribute name, layer) for the layers `owner` holds as attributes, in the order they were set."""
    for attr, value in vars(owner).items():
        if isinstance(value, Layer):
            yield attr, value
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, Layer):
                    yield f"{attr}.{i}", item
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, Layer):
                    yield f"{attr}.{key}", item


def leaf_layers(layer: Layer, prefix: Optional[str] = None) -> Iterator[tuple[Optional[str], Layer]]:
    """(path, built-in layer) under `layer`: itself, or for a CustomLayer, its sub-layers' leaves."""
    prefix = layer.name if prefix is None else prefix
    if not isinstance(layer, CustomLayer):
        yield prefix, layer
        return
    for attr, child in child_layers(layer):
        yield from leaf_layers(child, f"{prefix}.{attr}" if prefix else attr)


def name_layers(layer: Layer, name: str) -> None:
    """Name `layer` and, for a CustomLayer, its sub-layers by attribute path (as torch's named_modules)."""
    layer.name = name
    if isinstance(layer, CustomLayer):
        for attr, child in child_layers(layer):
            name_layers(child, f"{name}.{attr}")


@contextmanager
def recording_calls() -> Iterator[list[Call]]:
    """Collect the calls of built-in layers made inside the block (for export): yields the list of
    (layer, input Op, output) they are appended to."""
    global _calls
    _calls = []
    try:
        yield _calls
    finally:
        _calls = None


def as_input(X: Any) -> R.Op:
    """An Op for a layer's input: Ops pass through; arrays become constants (floats as float32, the
    parameters' dtype; integers as int64, as indices)."""
    if isinstance(X, Op):
        return cast(R.Op, X)   # the same class: ravop's stub types the Ops that R.<op> returns
    tensor = torch.as_tensor(np.asarray(X) if not isinstance(X, torch.Tensor) else X)
    if tensor.is_floating_point():
        tensor = tensor.to(torch.get_default_dtype())
    elif not tensor.is_complex() and tensor.dtype is not torch.bool:
        tensor = tensor.to(torch.int64)
    return R.t(tensor)


def flag(value: Any, name: str) -> bool:
    """A boolean option that the original API also accepted as the strings 'True'/'False'."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if value in ("True", "False"):
        return value == "True"
    raise ValueError(f"{name} must be True, False, 'True' or 'False', not {value!r}")


def _shape(shape: Union[int, Sequence[int]]) -> Shape:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
