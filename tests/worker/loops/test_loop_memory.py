"""A worker gives back to the operating system what a loop freed (its gradients, activations and checkpoint
buffer, which glibc keeps in the heap) once the loop has run, before its outputs go up to the server that still
holds its last checkpoint (issue 46: the server's peak comes then)."""
import re

import numpy as np

import ravop as R
from helpers import wait_for
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam

RNG = np.random.default_rng(7)
X = RNG.normal(size=(256, 64))
Y = np.eye(4)[RNG.integers(0, 4, 256)]


def test_a_worker_returns_what_a_loop_freed_to_the_os(engine, workers, client):
    [name] = workers.start(1, extra=("--checkpoint-steps", "5", "-v"))
    R.Graph(name="loop memory", seed=1)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(176, input_shape=(64,)))
    for _ in range(30):   # 121 KiB tensors: heap blocks under glibc's mmap threshold, kept when freed
        model.add(Activation("relu"))
        model.add(Dense(176))
    model.add(Dense(4))
    list(model.fit(X, Y, n_epochs=10, batch_size=32))
    model.persist_weights()
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    line = wait_for(lambda: re.search(r"RSS ([\d,.]+) MiB after a loop, ([\d,.]+) MiB once its values were "
                                      r"collected, ([\d,.]+) MiB after returning", workers.log(name)),
                    "the worker to log its RSS after the loop")
    before, _, after = (float(v.replace(",", "")) for v in line.groups())
    print(f"\nworker RSS after the loop: {before:,.1f} MiB, {after:,.1f} MiB after malloc_trim(0)")
    assert after < before - 4   # of ~15 MiB of parameters, gradients and the checkpoint buffer's copies
