"""Samples for the random ops (ravop/ops/random.py): the walk compares each with its kernel run on the same
seeded generator; tests/ops/test_ops_random.py checks ranges and reproducibility."""
from . import Sample

SAMPLES = {
    "random": [Sample((), {"size": (3, 4)}), Sample((), {"size": 5, "dtype": "float64"})],
    "random_uniform": [Sample((), {"low": -2.0, "high": 3.0, "size": (4, 2)}),
                       Sample((), {"size": (0, 3)}, note="empty")],
}
