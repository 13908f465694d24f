"""Samples for the activations (ravop/ops/activations.py) and their backward ops.

Forward references are torch.nn.functional; backward references are torch.autograd through it, evaluated
at the input that produced the saved value."""
import torch
import torch.nn.functional as TF

from ravop.ops.activations import ACTIVATIONS

from . import Sample
from .nn import autograd_grads, randn

_AXIS = {"softmax", "log_softmax", "softmin"}   # torch calls the axis `dim`
_INT_OK = {"relu", "hardtanh", "threshold", "sigmoid", "tanh", "softsign", "tanhshrink"}


def _functional(name):
    fn, defaults = getattr(TF, name), ACTIVATIONS[name][3]

    def reference(x, **params):
        params = {**defaults, **params}
        return fn(x, dim=params.pop("axis"), **params) if name in _AXIS else fn(x, **params)
    return reference


def _backward_ref(name, x, params):
    """Reference for `name_backward(g, saved)`: autograd of F.<name> at `x` (the saved value's source)."""
    fn = _functional(name)
    return lambda g, saved, **_: autograd_grads(lambda x: fn(x, **params), (x,), g, (0,))[0]


# Values that straddle each activation's kinks (hardshrink's ±0.5, hardtanh's ±1, ...) without landing on them.
_X = torch.tensor([[-3.2, -1.3, -0.7, -0.45, -0.1, 0.05], [0.3, 0.55, 0.9, 1.2, 2.5, 25.0]])

_EXTRA_PARAMS = {
    "softmax": [{"axis": 0}, {"axis": -2}],
    "log_softmax": [{"axis": 0}],
    "softmin": [{"axis": 0}],
    "leaky_relu": [{"negative_slope": 0.2}],
    "elu": [{"alpha": 0.5}],
    "softplus": [{"beta": 2.0, "threshold": 1.5}],
    "hardshrink": [{"lambd": 1.0}],
    "softshrink": [{"lambd": 1.0}],
    "hardtanh": [{"min_val": -0.5, "max_val": 2.0}],
    "threshold": [{"threshold": 0.5, "value": -7.0}],
    "gelu": [{"approximate": "tanh"}],
}


def _samples(name):
    ref = _functional(name)
    out = [Sample((_X,), reference=ref, note="values around the kinks"),
           Sample((randn(2, 3, 4, dtype=torch.float64),), reference=ref, note="3-d float64"),
           Sample((torch.zeros(0, 3),), reference=ref, note="empty")]
    out += [Sample((_X,), params, reference=ref, note=f"params {params}") for params in _EXTRA_PARAMS.get(name, [])]
    if name in _INT_OK:
        out.append(Sample((torch.tensor([[-2, 0, 3]]),), reference=ref, grad=False, note="integer input"))
    return out


def _backward_samples(name):
    saved = ACTIVATIONS[name][2]
    out = []
    for params in [{}] + _EXTRA_PARAMS.get(name, []):
        x = randn(3, 5, dtype=torch.float64) * 2
        value = x if saved == "x" else _functional(name)(x, **params)
        out.append(Sample((randn(3, 5, dtype=torch.float64), value), params,
                          reference=_backward_ref(name, x, params), note=f"params {params}"))
    return out


SAMPLES = {}
for _name in ACTIVATIONS:
    SAMPLES[_name] = _samples(_name)
    SAMPLES[f"{_name}_backward"] = _backward_samples(_name)
