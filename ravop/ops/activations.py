"""Activations (the 16 of RavDL's `Activation` layer, plus log_softmax and gelu), each with its backward op.

Every activation `name` gets a companion op `name_backward(g, saved, **params)` whose kernel is the aten
backward kernel eager autograd calls (`threshold_backward`, `_softmax_backward_data`, ...), so gradients
equal eager PyTorch's. `saved` is the activation's input or its output, whichever that kernel reads.
Params and defaults are torch.nn.functional's; `axis` is the softmax family's `dim`.
"""
import torch
import torch.nn.functional as F

from ..core import op_functions as R
from ..core.dtypes import is_floating
from ..core.registry import register
from . import rules, scriptable

aten = torch.ops.aten
SELU_ALPHA = 1.6732632423543772848170429916717   # torch's selu is elu with these two constants
SELU_SCALE = 1.0507009873554804934193349852946


def _float_only(x, **_):
    """Kernels that torch implements for floating dtypes only: say so at record time."""
    if not is_floating(x.dtype):
        raise TypeError(f"needs a floating-point input, not {x.dtype}")
    return x.shape, x.dtype


def _softmax_axis(x, axis=-1):
    rules.normalize_axis(axis, len(x.shape))
    return _float_only(x)


def _backward_shape(g, saved, **_):
    return saved.shape, g.dtype


def _softmax_backward(g, y, axis=-1):
    return aten._softmax_backward_data(g, y, axis % max(y.dim(), 1), y.dtype)


def _log_softmax_backward(g, y, axis=-1):
    return aten._log_softmax_backward_data(g, y, axis % max(y.dim(), 1), y.dtype)


def _softmin_backward(g, y, axis=-1):
    return torch.neg(aten._softmax_backward_data(g, y, axis % max(y.dim(), 1), y.dtype))


def _softsign_backward(g, x):
    # softsign is x / (1 + |x|) in torch, differentiated through div and abs; this is that chain.
    d = 1 + x.abs()
    return g / d + (-g * x / (d * d)) * x.sgn()


def _logsigmoid_backward(g, x):
    _, buffer = aten.log_sigmoid_forward(x)   # the forward's saved buffer, recomputed
    return aten.log_sigmoid_backward(g, x, buffer)


# name: (forward kernel, backward kernel, saved value "x" (input) or "y" (output), params, shape rule, the torch.nn
# module computing it, for the ones RavDL's Activation layer offers)
ACTIVATIONS = {
    "relu": (torch.relu, lambda g, y: aten.threshold_backward(g, y, 0), "y", {}, rules.same, "ReLU"),
    "sigmoid": (torch.sigmoid, aten.sigmoid_backward, "y", {}, rules.same_float, "Sigmoid"),
    "tanh": (torch.tanh, aten.tanh_backward, "y", {}, rules.same_float, "Tanh"),
    "softmax": (lambda x, axis=-1: torch.softmax(x, axis), _softmax_backward, "y", {"axis": -1}, _softmax_axis,
                "Softmax"),
    "log_softmax": (lambda x, axis=-1: torch.log_softmax(x, axis), _log_softmax_backward, "y", {"axis": -1},
                    _softmax_axis, None),
    "softmin": (lambda x, axis=-1: F.softmin(x, axis), _softmin_backward, "y", {"axis": -1}, _softmax_axis, "Softmin"),
    "leaky_relu": (lambda x, negative_slope=0.01: F.leaky_relu(x, negative_slope),
                   lambda g, x, negative_slope=0.01: aten.leaky_relu_backward(g, x, negative_slope, False),
                   "x", {"negative_slope": 0.01}, _float_only, "LeakyReLU"),
    "elu": (lambda x, alpha=1.0: F.elu(x, alpha), lambda g, x, alpha=1.0: aten.elu_backward(g, alpha, 1, 1, False, x),
            "x", {"alpha": 1.0}, _float_only, "ELU"),
    "selu": (F.selu, lambda g, x: aten.elu_backward(g, SELU_ALPHA, SELU_SCALE, 1, False, x), "x", {}, _float_only,
             "SELU"),
    "softplus": (lambda x, beta=1.0, threshold=20.0: F.softplus(x, beta, threshold),
                 lambda g, x, beta=1.0, threshold=20.0: aten.softplus_backward(g, x, beta, threshold),
                 "x", {"beta": 1.0, "threshold": 20.0}, _float_only, "Softplus"),
    "softsign": (F.softsign, _softsign_backward, "x", {}, rules.same_float, "Softsign"),
    "tanhshrink": (F.tanhshrink, lambda g, x: g - aten.tanh_backward(g, torch.tanh(x)), "x", {}, rules.same_float,
                   "Tanhshrink"),
    "logsigmoid": (F.logsigmoid, _logsigmoid_backward, "x", {}, _float_only, "LogSigmoid"),
    "hardshrink": (lambda x, lambd=0.5: F.hardshrink(x, lambd),
                   lambda g, x, lambd=0.5: aten.hardshrink_backward(g, x, lambd), "x", {"lambd": 0.5}, _float_only,
                   "Hardshrink"),
    "softshrink": (lambda x, lambd=0.5: F.softshrink(x, lambd),
                   lambda g, x, lambd=0.5: aten.softshrink_backward(g, x, lambd), "x", {"lambd": 0.5}, _float_only,
                   "Softshrink"),
    "hardtanh": (lambda x, min_val=-1.0, max_val=1.0: F.hardtanh(x, min_val, max_val),
                 lambda g, x, min_val=-1.0, max_val=1.0: aten.hardtanh_backward(g, x, min_val, max_val),
                 "x", {"min_val": -1.0, "max_val": 1.0}, rules.same, "Hardtanh"),
    "threshold": (lambda x, threshold=0.0, value=0.0: F.threshold(x, threshold, value),
                  lambda g, x, threshold=0.0, value=0.0: aten.threshold_backward(g, x, threshold),
                  "x", {"threshold": 0.0, "value": 0.0}, rules.same, "Threshold"),
    "gelu": (lambda x, approximate="none": F.gelu(x, approximate=approximate),
             lambda g, x, approximate="none": aten.gelu_backward(g, x, approximate=approximate),
             "x", {"approximate": "none"}, _float_only, None),
}


# The TorchScript-able torch function of the activations a saved RavDL model's forward code may apply.
TORCH_FUNCTIONS = {"relu": (torch.relu, scriptable.no_params), "sigmoid": (torch.sigmoid, scriptable.no_params),
                   "tanh": (torch.tanh, scriptable.no_params), "softmax": (scriptable.softmax, scriptable.same_params),
                   "log_softmax": (scriptable.log_softmax, scriptable.same_params)}


def _make_vjp(name, saved):
    backward_name = f"{name}_backward"

    def vjp(node, g, wants):
        value = node if saved == "y" else node.inputs[0]
        return (getattr(R, backward_name)(g, value, **node.params),)
    return vjp


def _kernel(fn, name, doc):
    """A named, documented kernel around `fn` (torch builtins and lambdas carry no usable name or doc)."""
    def kernel(*args, **params):
        return fn(*args, **params)
    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = doc
    return kernel


def _register_all():
    for name, (forward, backward, saved, params, shape, module) in ACTIVATIONS.items():
        listed = ", ".join(f"{k}={v!r}" for k, v in params.items())
        register(name, params=params, shape=shape, vjp=_make_vjp(name, saved), torch_module=module,
                 torch_function=TORCH_FUNCTIONS.get(name))(
            _kernel(forward, name, f"{name}(x{', ' + listed if listed else ''}): torch.nn.functional.{name}"))
        register(f"{name}_backward", inputs=("g", saved), params=params, shape=_backward_shape, method=False)(
            _kernel(backward, f"{name}_backward", f"Gradient of {name} w.r.t. its input, from the output "
                    f"gradient g and the saved {'input' if saved == 'x' else 'output'}."))


_register_all()
