"""A loop handed its carried initial values (`LoopRun(..., donated=...)`, what a worker does with the inputs a
loop releases: worker/loops/loop_subgraph.py) updates them in place instead of copying them first (issue 46: one
copy of the model less on the worker), with the same bits; what would change another value's reads is still
copied, and a second run from the updated values is refused."""
import numpy as np
import pytest
import torch

import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.core.errors import PlanError
from ravop.record.graph import current_graph
from ravop.record.loop import Loop
from ravop.runtime.evaluate import evaluate
from ravop.runtime.loop_run import LoopRun

RNG = np.random.default_rng(2)
X = RNG.normal(size=(40, 4))
Y = np.eye(3)[RNG.integers(0, 3, 40)]


def fit_loop(name):
    """(spec, input values, seed) of a small Adam fit's one loop, recorded in this process."""
    R.Graph(name=name, seed=3)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    for layer in (Dense(8, input_shape=(4,)), Activation("relu"), Dense(3)):
        model.add(layer)
    list(model.fit(X, Y, n_epochs=3, batch_size=8, shuffle=True))
    graph = current_graph()
    ((loop_id, record),) = graph.loops.items()
    return record.spec, evaluate(list(graph.nodes[loop_id].inputs)), graph.seed


def test_donated_initial_values_are_updated_in_place_with_the_same_bits():
    spec, inputs, seed = fit_loop("donated")
    given = [value.clone() for value in inputs]
    copied = LoopRun(spec, inputs, seed).run()
    assert all(torch.equal(a, b) for a, b in zip(inputs, given))   # a run that was not handed them copies them
    run = LoopRun(spec, given, seed, donated=range(spec.n_carried))
    assert run.donated, "the fit's parameters and optimizer moments are the loop's own"
    donated = run.run()
    assert all(torch.equal(a, b) for a, b in zip(copied, donated))
    for k in run.donated:   # the tensor handed over is the one trained: no copy was made of it
        assert donated[k] is given[k]
    with pytest.raises(PlanError, match="donated initial values"):
        run.run()


def test_a_tensor_given_at_two_positions_or_read_by_a_step_is_still_copied():
    R.Graph(name="donated twice", seed=3)
    x = R.t(torch.arange(4.0))
    loop = Loop([R.t(torch.ones(4)), R.t(torch.ones(4)), x])
    with loop.step() as step:
        a, b, c = step.carried
        step.carry([a * x, b * x + a, c + 1])   # x, the third's initial value, is read by the step too
    loop.run([(0, 2)])
    graph = current_graph()
    ((loop_id, record),) = graph.loops.items()
    inputs = evaluate(list(graph.nodes[loop_id].inputs))
    shared = torch.ones(4)
    inputs[0] = inputs[1] = shared   # one tensor for both initial values
    run = LoopRun(record.spec, inputs, graph.seed, donated=range(3))
    assert run.donated == set()
    after = run.run()
    assert torch.equal(shared, torch.ones(4))
    assert torch.equal(after[0], torch.arange(4.0) ** 2) and torch.equal(after[2], torch.arange(4.0) + 2)
