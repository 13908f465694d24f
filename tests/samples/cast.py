"""Samples for `cast` (ravop/ops/cast.py)."""
from . import Sample
from ._numpy import ints, normal, numpy

SAMPLES = {
    "cast": [
        Sample((normal(2, 3),), {"dtype": "float32"}, reference=numpy(lambda x, dtype: x.astype(dtype)), grad=False,
               note="float64 to float32, the layers' input dtype"),
        Sample((normal(2, 3),), {"dtype": "float64"}, reference=numpy(lambda x, dtype: x.astype(dtype)),
               note="same dtype: the gradient passes through"),
        Sample((normal(4) * 3,), {"dtype": "int64"}, reference=numpy(lambda x, dtype: x.astype(dtype)), grad=False,
               note="floats truncate toward zero"),
        Sample((ints(0, 3, 5),), {"dtype": "bool"}, reference=numpy(lambda x, dtype: x.astype(dtype)), grad=False),
    ],
}
