"""Samples for zeros and arange (ravop/ops/creation.py)."""
import numpy as np

from . import Sample


SAMPLES = {
    "zeros": [
        Sample((), {"shape": (2, 3)}, reference=lambda shape: np.zeros(shape)),
        Sample((), {"shape": 4, "dtype": "int32"}, reference=lambda shape, dtype: np.zeros(shape, dtype)),
        Sample((), {"shape": (0, 2)}, reference=lambda shape: np.zeros(shape), note="empty"),
    ],
    "arange": [
        Sample((), {"start": 5}, reference=lambda start: np.arange(start)),
        Sample((), {"start": 1, "stop": 10, "step": 3},
               reference=lambda start, stop, step: np.arange(start, stop, step)),
        Sample((), {"start": 0.5, "stop": -1.0, "step": -0.25},
               reference=lambda start, stop, step: np.arange(start, stop, step), note="floats, negative step"),
        Sample((), {"start": 3, "stop": 1}, reference=lambda start, stop: np.arange(start, stop), note="empty"),
    ],
}
