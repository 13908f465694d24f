"""Dense, Embedding, Flatten, Dropout and Activation."""
from typing import Any, Optional, Sequence, Union, cast

import torch

import ravop as R
from ravop.core import registry
from ravop.ops.rules import Like

from . import init
from .base import Flag, Layer, Shape, flag, shape_by_rule


class Dense(Layer):
    """A fully connected layer, torch.nn.Linear: (batch, ..., in) -> (batch, ..., n_units).

    `initial_W` (n_units, in_features) and `initial_w0` (n_units,) are in torch's layout; they are the
    starting values, which training then updates."""

    def __init__(self, n_units: int, initial_W: Any = None, initial_w0: Any = None, use_bias: Flag = 'True',
                 input_shape: Union[int, Sequence[int], None] = None) -> None:
        super().__init__(input_shape)
        self.n_units = int(n_units)
        self.use_bias = flag(use_bias, "use_bias")
        if initial_w0 is not None and not self.use_bias:
            raise ValueError("initial_w0 was given but use_bias is False")
        self.initial_W, self.initial_w0 = initial_W, initial_w0

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {"weight": (self.n_units, input_shape[-1])}
        if self.use_bias:
            shapes["bias"] = (self.n_units,)
        return shapes

    def initial_values(self, input_shape: Shape, generator: torch.Generator
                       ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        shapes = self.param_shapes(input_shape)
        if self.initial_W is None:
            weight = init.kaiming_uniform(shapes["weight"], generator)
        else:
            weight = init.given(self.initial_W, shapes["weight"], "Dense initial_W")
        params = {"weight": weight}
        if self.use_bias:
            params["bias"] = (init.fan_in_uniform(shapes["bias"], weight, generator) if self.initial_w0 is None
                              else init.given(self.initial_w0, shapes["bias"], "Dense initial_w0"))
        return params, {}

    def output_shape(self, input_shape: Shape) -> Shape:
        return shape_by_rule(R.linear, input_shape, Like(self.param_shapes(input_shape)["weight"], torch.float32))

    def forward(self, X: R.Op, training: bool) -> R.Op:
        return R.linear(X, self.params["weight"], self.params.get("bias"))

    def torch_spec(self) -> tuple[str, dict[str, Any]]:
        return "Linear", {"in_features": cast(Shape, self.input_shape)[-1], "out_features": self.n_units,
                          "bias": self.use_bias}


class Embedding(Layer):
    """Rows of a (vocab_size, embed_dim) table picked by integer indices, torch.nn.Embedding."""
    input_dtype = None   # indices

    def __init__(self, vocab_size: int, embed_dim: int, initial_W: Any = None,
                 input_shape: Union[int, Sequence[int], None] = None) -> None:
        super().__init__(input_shape)
        self.vocab_size, self.embed_dim = int(vocab_size), int(embed_dim)
        self.initial_W = initial_W

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        return {"weight": (self.vocab_size, self.embed_dim)}

    def initial_values(self, input_shape: Shape, generator: torch.Generator
                       ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        shape = (self.vocab_size, self.embed_dim)
        weight = (init.normal(shape, generator) if self.initial_W is None
                  else init.given(self.initial_W, shape, "Embedding initial_W"))
        return {"weight": weight}, {}

    def output_shape(self, input_shape: Shape) -> Shape:
        return shape_by_rule(R.embedding, input_shape, Like(self.param_shapes(input_shape)["weight"], torch.float32),
                             dtype=torch.int64)

    def forward(self, X: R.Op, training: bool) -> R.Op:
        return R.embedding(X, self.params["weight"])

    def torch_spec(self) -> tuple[str, dict[str, Any]]:
        return "Embedding", {"num_embeddings": self.vocab_size, "embedding_dim": self.embed_dim}


class Flatten(Layer):
    """Merge dimensions start_dim..end_dim (counted with the batch dimension as 0), torch.nn.Flatten."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1, input_shape: Union[int, Sequence[int], None] = None
                 ) -> None:
        super().__init__(input_shape)
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)

    def output_shape(self, input_shape: Shape) -> Shape:
        return shape_by_rule(R.flatten, input_shape, start_dim=self.start_dim, end_dim=self.end_dim)

    def forward(self, X: R.Op, training: bool) -> R.Op:
        return R.flatten(X, start_dim=self.start_dim, end_dim=self.end_dim)

    def torch_spec(self) -> tuple[str, dict[str, Any]]:
        return "Flatten", {"start_dim": self.start_dim, "end_dim": self.end_dim}


class Dropout(Layer):
    """Zero each element with probability p while training (scaling the rest by 1/(1-p)); identity in eval.
    The mask is drawn by the op from a seed derived from the graph seed, so a re-run draws the same mask."""

    def __init__(self, p: float = 0.5, input_shape: Union[int, Sequence[int], None] = None) -> None:
        super().__init__(input_shape)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], not {p}")
        self.p = float(p)

    def forward(self, X: R.Op, training: bool) -> R.Op:
        return R.dropout(X, p=self.p, training=bool(training))

    def torch_spec(self) -> tuple[str, dict[str, Any]]:
        return "Dropout", {"p": self.p}


class Activation(Layer):
    """An activation function by name: an op with a torch.nn module (`OpDef.torch_module`). Keyword params go to
    its op (e.g. Activation('leaky_relu', negative_slope=0.2), Activation('softmax', axis=1))."""

    def __init__(self, name: str = 'relu', input_shape: Union[int, Sequence[int], None] = None, **params: Any
                 ) -> None:
        super().__init__(input_shape)
        opdef = registry.REGISTRY.get(name)
        if opdef is None or opdef.name != name or opdef.torch_module is None:
            supported = [d.name for d in registry.unique_opdefs() if d.torch_module is not None]
            raise ValueError(f"unknown activation {name!r}; supported: {', '.join(supported)}")
        defaults = opdef.params
        unknown = set(params) - set(defaults)
        if unknown:
            raise TypeError(f"activation {name!r} takes params {tuple(defaults) or 'none'}, not {sorted(unknown)}")
        self.activation = name
        self.op_params = {**defaults, **params}

    def forward(self, X: R.Op, training: bool) -> R.Op:
        return getattr(R, self.activation)(X, **self.op_params)

    def torch_spec(self) -> tuple[Optional[str], dict[str, Any]]:
        module = registry.get(self.activation).torch_module
        return module, {("dim" if k == "axis" else k): v for k, v in self.op_params.items()}
