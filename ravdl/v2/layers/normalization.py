"""BatchNormalization1D/2D and LayerNormalization.

Batch norm's running statistics are graph state: a training forward pass records `batch_norm`, whose second
and third outputs are the moved statistics, and the layer holds those Ops from then on; an eval pass reads
them. `momentum` is torch's (new = (1 - momentum) * old + momentum * batch), so the original API's default
0.99 nearly replaces the statistics with each batch's: kept as the default, with a warning once per process
(ravdl.v2.traps) naming torch's default 0.1.
"""
from typing import Any, Optional, Sequence, Union, cast

import torch

import ravop as R

from .. import traps
from . import init
from .base import Flag, Layer, Shape, flag

MOMENTUM = traps.OriginalDefault(0.99)   # the original API's default, which warns (a given 0.99 does not)


class _BatchNormalization(Layer):
    torch_class: Optional[str] = None
    input_dims: tuple[int, ...] = ()   # accepted numbers of input dimensions, without the batch dimension

    def __init__(self, num_features: Optional[int] = None, momentum: float = MOMENTUM, epsilon: float = 0.01,
                 affine: Flag = True, initial_gamma: Any = None, initial_beta: Any = None,
                 initial_running_mean: Any = None, initial_running_var: Any = None,
                 input_shape: Union[int, Sequence[int], None] = None) -> None:
        super().__init__(input_shape)
        self.num_features = None if num_features is None else int(num_features)
        if momentum is MOMENTUM:
            traps.default_momentum(type(self).__name__)
        self.momentum, self.epsilon = float(momentum), float(epsilon)
        self.affine = flag(affine, "affine")
        if not self.affine and (initial_gamma is not None or initial_beta is not None):
            raise ValueError("initial_gamma/initial_beta were given but affine is False")
        self.initial = {"weight": initial_gamma, "bias": initial_beta, "running_mean": initial_running_mean,
                        "running_var": initial_running_var}
        self.batches_tracked = 0

    def _features(self, input_shape: Shape) -> int:
        if len(input_shape) not in self.input_dims:
            dims = " or ".join(str(d + 1) for d in self.input_dims)
            raise ValueError(f"{type(self).__name__} needs {dims}-d input (with the batch dimension), "
                             f"got shape {input_shape} without it")
        if self.num_features is not None and input_shape[0] != self.num_features:
            raise ValueError(f"{type(self).__name__}(num_features={self.num_features}) got {input_shape[0]} "
                             f"channels (input shape {input_shape} without the batch dimension)")
        return input_shape[0]

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        c = self._features(input_shape)
        return {"weight": (c,), "bias": (c,)} if self.affine else {}

    def initial_values(self, input_shape: Shape, generator: torch.Generator
                       ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        c = self._features(input_shape)
        defaults = {"weight": torch.ones(c), "bias": torch.zeros(c), "running_mean": torch.zeros(c),
                    "running_var": torch.ones(c)}
        values = {name: default if self.initial[name] is None else init.given(self.initial[name], (c,),
                                                                                f"initial {name}")
                  for name, default in defaults.items()}
        params = {"weight": values["weight"], "bias": values["bias"]} if self.affine else {}
        return params, {"running_mean": values["running_mean"], "running_var": values["running_var"]}

    def forward(self, X: R.Op, training: bool) -> R.Op:
        y, running_mean, running_var = R.batch_norm(
            X, self.buffers["running_mean"], self.buffers["running_var"], self.params.get("weight"),
            self.params.get("bias"), training=bool(training), momentum=self.momentum, eps=self.epsilon)
        if training:
            self.buffers = {"running_mean": running_mean, "running_var": running_var}
            self.batches_tracked += 1
        return y

    def torch_spec(self) -> tuple[Optional[str], dict[str, Any]]:
        return self.torch_class, {"num_features": cast(Shape, self.input_shape)[0], "eps": self.epsilon,
                                  "momentum": self.momentum, "affine": self.affine}

    def torch_extra_state(self) -> dict[str, Any]:
        return {"num_batches_tracked": self.batches_tracked}


class BatchNormalization1D(_BatchNormalization):
    """Batch norm over (batch, channels) or (batch, channels, length) input, torch.nn.BatchNorm1d."""
    torch_class = "BatchNorm1d"
    input_dims = (1, 2)

    def __init__(self, momentum: float = MOMENTUM, epsilon: float = 0.01, affine: Flag = True,
                 initial_gamma: Any = None, initial_beta: Any = None, initial_running_mean: Any = None,
                 initial_running_var: Any = None, input_shape: Union[int, Sequence[int], None] = None) -> None:
        super().__init__(None, momentum, epsilon, affine, initial_gamma, initial_beta, initial_running_mean,
                         initial_running_var, input_shape)


class BatchNormalization2D(_BatchNormalization):
    """Batch norm over (batch, channels, height, width) input, torch.nn.BatchNorm2d."""
    torch_class = "BatchNorm2d"
    input_dims = (3,)

    def __init__(self, num_features: int, momentum: float = MOMENTUM, epsilon: float = 0.01, affine: Flag = True,
                 initial_gamma: Any = None, initial_beta: Any = None, initial_running_mean: Any = None,
                 initial_running_var: Any = None, input_shape: Union[int, Sequence[int], None] = None) -> None:
        super().__init__(num_features, momentum, epsilon, affine, initial_gamma, initial_beta,
                         initial_running_mean, initial_running_var, input_shape)


class LayerNormalization(Layer):
    """Normalise over the trailing `normalized_shape` dimensions (default: the last one), with a learned
    per-element scale (`initial_W`) and shift (`initial_w0`), torch.nn.LayerNorm."""

    def __init__(self, normalized_shape: Union[int, Sequence[int], None] = None, epsilon: float = 1e-5,
                 initial_W: Any = None, initial_w0: Any = None,
                 input_shape: Union[int, Sequence[int], None] = None) -> None:
        super().__init__(input_shape)
        if normalized_shape is not None:
            normalized_shape = ((int(normalized_shape),) if isinstance(normalized_shape, int)
                                else tuple(int(d) for d in normalized_shape))
        self.normalized_shape: Optional[Shape] = normalized_shape
        self.epsilon = float(epsilon)
        self.initial_W, self.initial_w0 = initial_W, initial_w0

    def _normalized(self, input_shape: Shape) -> Shape:
        shape = self.normalized_shape or tuple(input_shape[-1:])
        if tuple(input_shape[len(input_shape) - len(shape):]) != shape:
            raise ValueError(f"LayerNormalization(normalized_shape={shape}) does not match the end of the "
                             f"input shape {input_shape}")
        return shape

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        shape = self._normalized(input_shape)
        return {"weight": shape, "bias": shape}

    def initial_values(self, input_shape: Shape, generator: torch.Generator
                       ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        shape = self._normalized(input_shape)
        weight = torch.ones(shape) if self.initial_W is None else init.given(self.initial_W, shape,
                                                                              "LayerNormalization initial_W")
        bias = torch.zeros(shape) if self.initial_w0 is None else init.given(self.initial_w0, shape,
                                                                              "LayerNormalization initial_w0")
        return {"weight": weight, "bias": bias}, {}

    def forward(self, X: R.Op, training: bool) -> R.Op:
        return R.layer_norm(X, self.params["weight"], self.params["bias"],
                            normalized_shape=self._normalized(cast(Shape, self.input_shape)), eps=self.epsilon)

    def torch_spec(self) -> tuple[str, dict[str, Any]]:
        return "LayerNorm", {"normalized_shape": list(self._normalized(cast(Shape, self.input_shape))),
                             "eps": self.epsilon}
