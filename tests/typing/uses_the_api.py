"""A requester script as a user writes it: tests/project/test_typing.py runs mypy over it and ravop's stub, so the
generated signatures stay usable (this file is type-checked, never run)."""
import numpy as np
import torch

import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Dense
from ravdl.v2.optimizers import Adam

R.initialize()
R.Graph(name="typed", algorithm="demo")
a = R.t([1.0, 2.0, 3.0])
b = R.t(np.ones(3), dtype="float32")
c = R.add(a, b).exp().sum(axis=0, keepdims=False) + 1.0
d = R.matmul(R.t(torch.eye(3)), a) @ a
values, indices = R.sort(a, axis=0, return_indices=True)
parts = R.concat([a, b], axis=0)
first = a[0]
loss = R.mean(R.square(a - b))
(gradient,) = R.grad(loss, [a])
e = R.Tensor([[1.0, 2.0]], name="e").reshape((2,)) * R.Scalar(2.0).exp()   # the original's classes make Ops
constant = isinstance(e, R.Tensor) or isinstance(e, R.Scalar)
c.persist_op(name="c")
summary = R.activate()
R.execute()
R.track_progress(progress_bar=False)
value = R.fetch_persisting_op(op_name="c")

model = NeuralNetwork(optimizer=Adam(), loss="SquareLoss")
model.add(Dense(4, input_shape=(3,)))
