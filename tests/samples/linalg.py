"""Samples for matmul, dot, tensordot and inv (ravop/ops/linalg.py), with numpy references."""
import numpy as np

from . import Sample
from ._numpy import f32, ints, normal, numpy

well_conditioned = normal(2, 3, 3) + 4 * np.eye(3)

SAMPLES = {
    "matmul": [
        Sample((normal(3, 4), normal(4, 2)), reference=numpy(np.matmul)),
        Sample((normal(2, 1, 3, 4), normal(5, 4, 2)), reference=numpy(np.matmul), note="batch broadcasting"),
        Sample((normal(4), normal(2, 4, 3)), reference=numpy(np.matmul), note="1-D left operand"),
        Sample((normal(2, 3, 4), normal(4)), reference=numpy(np.matmul), note="1-D right operand"),
        Sample((normal(4), normal(4)), reference=numpy(np.matmul), note="two vectors: 0-d result"),
        Sample((f32(3, 4), normal(4, 2)), reference=numpy(np.matmul), note="float32 with float64 promotes"),
        Sample((ints(-3, 3, 2, 3), ints(-3, 3, 3, 2)), reference=numpy(np.matmul), grad=False, note="ints"),
        Sample((normal(0, 4), normal(4, 2)), reference=numpy(np.matmul), note="empty rows"),
    ],
    "dot": [
        Sample((normal(3, 4), normal(4, 2)), reference=numpy(np.dot)),
        Sample((normal(4), normal(4)), reference=numpy(np.dot), note="inner product"),
        Sample((normal(3, 4), normal(4)), reference=numpy(np.dot), note="matrix-vector"),
        Sample((normal(2, 3, 4), normal(5, 4, 2)), reference=numpy(np.dot), note="N-d: last with second-to-last"),
        Sample((np.float64(2.5), normal(3, 2)), reference=numpy(np.dot), note="0-d operand multiplies"),
        Sample((ints(0, 4, 2, 3), ints(0, 4, 3)), reference=numpy(np.dot), grad=False, note="ints"),
    ],
    "tensordot": [
        Sample((normal(2, 3, 4), normal(3, 4, 5)), reference=numpy(np.tensordot), note="default axes=2"),
        Sample((normal(2, 3, 4), normal(4, 5, 3)), {"axes": ((1, 2), (2, 0))},
               reference=numpy(lambda x, y, axes: np.tensordot(x, y, axes)), note="explicit, reordered pairs"),
        Sample((normal(2, 3), normal(4)), {"axes": 0},
               reference=numpy(lambda x, y, axes: np.tensordot(x, y, axes)), note="outer product"),
        Sample((normal(3, 4), normal(5, 4)), {"axes": (-1, -1)},
               reference=numpy(lambda x, y, axes: np.tensordot(x, y, axes)), note="negative axes"),
    ],
    "inv": [
        Sample((well_conditioned[0],), reference=numpy(np.linalg.inv)),
        Sample((well_conditioned,), reference=numpy(np.linalg.inv), note="a batch of matrices"),
        Sample((np.array([[2, 1], [1, 1]]),), reference=numpy(np.linalg.inv), grad=False, note="ints give floats"),
    ],
}
