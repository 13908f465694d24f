"""Samples for foreach (ravop/ops/foreach.py) and kernel_vjp (ravop/ops/kernel_vjp.py), which differentiates
ops like foreach through their own kernels."""
import numpy as np
import torch

from . import Sample
from ._numpy import normal, numpy


def _foreach(fn):
    return numpy(lambda x, operation, params: np.stack([fn(row, **params) for row in x]))


def _prod_grad(x, g, op, params):
    x = x.clone().requires_grad_()
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(x.prod(dim=dict(params)["axis"]), x, g)
    return grad


SAMPLES = {
    "foreach": [
        Sample((normal(3, 4, 2),), {"operation": "sum", "params": {"axis": 0}}, reference=_foreach(np.sum)),
        Sample((normal(3, 4),), {"operation": "sort", "params": {}}, reference=_foreach(np.sort),
               note="default params"),
        Sample((normal(2, 3, 3) + 3 * np.eye(3),), {"operation": "inv", "params": {}},
               reference=_foreach(np.linalg.inv)),
        Sample((normal(0, 3),), {"operation": "mean", "params": {}}, reference=lambda x, **_: torch.zeros(0),
               note="no slices"),
    ],
    "kernel_vjp": [
        Sample((np.array([[2.0, 0.0, 3.0], [1.0, 4.0, 5.0]]), normal(2)),
               {"op": "prod", "params": {"axis": 1, "keepdims": False}}, reference=_prod_grad),
    ],
}
