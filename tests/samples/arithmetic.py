"""Samples for the elementwise arithmetic ops (ravop/ops/arithmetic.py), with numpy references."""
import numpy as np
import torch

from . import Sample
from ._numpy import f32, ints, normal, numpy

positive = np.abs(normal(3, 4)) + 0.5


def _binary(fn):
    return [
        Sample((normal(3, 4), normal(3, 4)), reference=numpy(fn)),
        Sample((normal(3, 1), normal(4)), reference=numpy(fn), note="broadcasting both ways"),
        Sample((f32(2, 3), np.float64(1.5)), reference=numpy(fn), note="0-d operand keeps the tensor dtype"),
        Sample((ints(-5, 5, 4), ints(1, 5, 4)), reference=numpy(fn), grad=False, note="integers"),
        Sample((normal(0, 3), normal(1, 3)), reference=numpy(fn), note="empty"),
    ]


def _clip(x, lower_limit=None, upper_limit=None):
    return np.clip(x, lower_limit, upper_limit)


def _clip_samples():
    return [
        Sample((normal(4, 5),), {"lower_limit": -0.5, "upper_limit": 0.5}, reference=numpy(_clip)),
        Sample((normal(6),), {"lower_limit": 0.0}, reference=numpy(_clip), note="one-sided"),
        Sample((np.arange(-4, 5),), {"lower_limit": -2, "upper_limit": 3}, grad=False, reference=numpy(_clip),
               note="integer input and limits stay integer"),
        Sample((torch.arange(-4, 5),), {"upper_limit": 1.5}, grad=False,
               reference=lambda x, upper_limit: torch.clamp(x.double(), max=1.5),
               note="a float limit makes ints float"),
    ]


SAMPLES = {
    "add": _binary(np.add),
    "sub": _binary(np.subtract),
    "mul": _binary(np.multiply),
    "div": [
        Sample((normal(3, 4), positive), reference=numpy(np.divide)),
        Sample((normal(2, 1, 4), positive), reference=numpy(np.divide), note="broadcast to 3-d"),
        Sample((ints(-9, 9, 5), ints(1, 4, 5)), reference=numpy(np.true_divide), grad=False,
               note="true division of ints gives floats"),
    ],
    "pow": [
        Sample((positive, normal(3, 4)), reference=numpy(np.power)),
        Sample((positive, np.float64(2.0)), reference=numpy(np.power), note="0-d exponent"),
        Sample((ints(0, 5, 4), ints(0, 3, 4)), reference=numpy(np.power), grad=False, note="integers"),
    ],
    "neg": [Sample((normal(3, 4),), reference=numpy(np.negative)),
            Sample((ints(-3, 3, 5),), reference=numpy(np.negative), grad=False)],
    "pos": [Sample((normal(3, 4),), reference=numpy(np.positive))],
    "abs": [Sample((normal(3, 4),), reference=numpy(np.abs)),
            Sample((ints(-3, 3, 5),), reference=numpy(np.abs), grad=False, note="integers")],
    "round": [Sample((normal(3, 4) * 3,), reference=numpy(np.round), note="zero gradient everywhere"),
              Sample((np.array([-2.5, -0.5, 0.5, 1.5, 2.5], dtype=np.float32),), reference=numpy(np.round), grad=False,
                     note="ties to even, as torch.round")],
    "sign": [Sample((normal(3, 4),), reference=numpy(np.sign), note="zero gradient everywhere"),
             Sample((np.array([-2, 0, 3]),), reference=numpy(np.sign), grad=False)],
    "exp": [Sample((normal(3, 4),), reference=numpy(np.exp)),
            Sample((ints(-3, 3, 4),), reference=numpy(np.exp), grad=False, note="ints give floats")],
    "natlog": [Sample((positive,), reference=numpy(np.log))],
    "square": [Sample((normal(3, 4),), reference=numpy(np.square)),
               Sample((ints(-3, 3, 4),), reference=numpy(np.square), grad=False)],
    "square_root": [Sample((positive,), reference=numpy(np.sqrt)),
                    Sample((np.array([0, 1, 4, 9]),), reference=numpy(np.sqrt), grad=False, note="ints")],
    "cube": [Sample((normal(3, 4),), reference=numpy(lambda x: x ** 3))],
    "cube_root": [Sample((normal(3, 4),), reference=numpy(np.cbrt), note="negative inputs too")],
    "clip": _clip_samples(),
}

