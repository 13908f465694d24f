"""Conv2D and MaxPooling2D, with every option of torch.nn.Conv2d and torch.nn.MaxPool2d. Output shapes come
from the ops' own shape rules, so the summary and the recorded graph cannot disagree."""
from typing import Any, Optional, Sequence, Union

import torch

import ravop as R
from ravop.ops.nn import PADDING_MODES
from ravop.ops.rules import Like

from . import init
from .base import Flag, Layer, Shape, flag, shape_by_rule

IntOrPair = Union[int, Sequence[int]]


def _pair(v: IntOrPair) -> tuple[int, ...]:
    return (int(v), int(v)) if isinstance(v, int) else tuple(int(x) for x in v)


def _option(v: Union[IntOrPair, str]) -> Union[int, str, tuple[int, ...]]:
    """An int or pair option as given (ints stay ints, pairs become tuples), so params stay canonical."""
    return v if isinstance(v, (int, str)) else tuple(int(x) for x in v)


class Conv2D(Layer):
    """2-d convolution over (batch, in_channels, height, width); `padding` may be an int, a pair, 'same' or
    'valid', and `padding_mode` 'zeros', 'reflect', 'replicate' or 'circular'. `initial_W` has torch's
    layout (out_channels, in_channels / groups, kh, kw), `initial_w0` (out_channels,)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrPair, stride: IntOrPair = 1,
                 padding: Union[IntOrPair, str] = 0, dilation: IntOrPair = 1, groups: int = 1, bias: Flag = True,
                 padding_mode: str = 'zeros', initial_W: Any = None, initial_w0: Any = None,
                 input_shape: Union[int, Sequence[int], None] = None) -> None:
        super().__init__(input_shape)
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), int(groups)
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible "
                             f"by groups ({groups})")
        self.kernel_size = _pair(kernel_size)
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {PADDING_MODES}, not {padding_mode!r}")
        self.options: dict[str, Any] = {
                        "stride": _option(stride), "padding": _option(padding), "dilation": _option(dilation),
                        "groups": self.groups, "padding_mode": padding_mode}
        self.bias = flag(bias, "bias")
        if initial_w0 is not None and not self.bias:
            raise ValueError("initial_w0 was given but bias is False")
        self.initial_W, self.initial_w0 = initial_W, initial_w0

    def param_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        self._check_channels(input_shape)
        shapes: dict[str, Shape] = {"weight": (self.out_channels, self.in_channels // self.groups) + self.kernel_size}
        if self.bias:
            shapes["bias"] = (self.out_channels,)
        return shapes

    def _check_channels(self, input_shape: Shape) -> None:
        if len(input_shape) != 3 or input_shape[0] != self.in_channels:
            raise ValueError(f"Conv2D(in_channels={self.in_channels}) needs input (batch, {self.in_channels}, "
                             f"height, width), got {input_shape} without the batch dimension")

    def initial_values(self, input_shape: Shape, generator: torch.Generator
                       ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        shapes = self.param_shapes(input_shape)
        weight = (init.kaiming_uniform(shapes["weight"], generator) if self.initial_W is None
                  else init.given(self.initial_W, shapes["weight"], "Conv2D initial_W"))
        params = {"weight": weight}
        if self.bias:
            params["bias"] = (init.fan_in_uniform(shapes["bias"], weight, generator) if self.initial_w0 is None
                              else init.given(self.initial_w0, shapes["bias"], "Conv2D initial_w0"))
        return params, {}

    def output_shape(self, input_shape: Shape) -> Shape:
        self._check_channels(input_shape)
        weight = Like((self.out_channels, self.in_channels // self.groups) + self.kernel_size, torch.float32)
        return shape_by_rule(R.conv2d, input_shape, weight, None, **self.options)

    def forward(self, X: R.Op, training: bool) -> R.Op:
        return R.conv2d(X, self.params["weight"], self.params.get("bias"), **self.options)

    def torch_spec(self) -> tuple[str, dict[str, Any]]:
        return "Conv2d", {"in_channels": self.in_channels, "out_channels": self.out_channels,
                          "kernel_size": list(self.kernel_size), "bias": self.bias,
                          **{k: list(v) if isinstance(v, tuple) else v for k, v in self.options.items()}}


class MaxPooling2D(Layer):
    """2-d max pooling, torch.nn.MaxPool2d; with return_indices=True the layer returns (values, indices)."""

    def __init__(self, kernel_size: IntOrPair, stride: Optional[IntOrPair] = None, padding: IntOrPair = 0,
                 dilation: IntOrPair = 1, return_indices: Flag = False, ceil_mode: Flag = False,
                 input_shape: Union[int, Sequence[int], None] = None) -> None:
        super().__init__(input_shape)
        self.options: dict[str, Any] = {
                        "kernel_size": _option(kernel_size), "stride": None if stride is None else _option(stride),
                        "padding": _option(padding), "dilation": _option(dilation),
                        "ceil_mode": flag(ceil_mode, "ceil_mode"),
                        "return_indices": flag(return_indices, "return_indices")}

    def output_shape(self, input_shape: Shape) -> Shape:
        return shape_by_rule(R.max_pool2d, input_shape, **self.options)

    def forward(self, X: R.Op, training: bool) -> R.Op:
        if training and not self.options["return_indices"]:
            # Keep the argmax: the backward pass routes the gradient through it instead of pooling again.
            values, _ = R.max_pool2d(X, **{**self.options, "return_indices": True})
            return values
        return R.max_pool2d(X, **self.options)

    def torch_spec(self) -> tuple[str, dict[str, Any]]:
        return "MaxPool2d", {k: list(v) if isinstance(v, tuple) else v for k, v in self.options.items()}
