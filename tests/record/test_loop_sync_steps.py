"""Two things a sync template (a loop step recorded with counts=False that runs after training steps, ravop.record.loop)
needs to belong to the training step it follows, as a resident pipeline stage's `update` and `forward m` /
`backward m` templates do: an optimizer step recorded with counter 0 (it runs at the training step's count, from
1), and a seed stream shared by two templates (`Step.seed_by_step`: both draw the same masks at each step, new ones
at the next)."""
import numpy as np
import pytest
import torch

import ravop as R
from ravop.core.errors import ShapeError
from ravop.ops.nn import _dropout_noise
from ravop.record.loop import Loop
from ravop.runtime.evaluate import evaluate_persisted
from ravop.runtime.runner import op_seed, step_seed

N_STEPS, LR = 5, 0.05
GRADS = np.random.default_rng(3).normal(size=(N_STEPS, 4)).astype(np.float32)


def record_adam_in_sync(step_value):
    """A loop whose training step picks step k's gradient (a counter op) into a carried slot and whose sync
    template steps Adam on it, recorded with `step=step_value`; persists the parameter after each step."""
    graph = R.Graph(name="sync adam", seed=4)
    param, zeros = R.t(np.ones(4, dtype=np.float32)), R.zeros(shape=(4,), dtype="float32")
    table = R.t(GRADS)
    loop = Loop([param, zeros, zeros, zeros])
    with loop.step() as step:
        p, _, m, v = step.carried
        step.carry([p, R.step_row(table, row=0), m, v])
    with loop.step(counts=False) as step:
        p, g, m, v = step.carried
        new_p, new_m, new_v, _ = R.adam_step(p, g, m, v, zeros, step=step_value, lr=LR)
        step.carry([new_p, g, new_m, new_v])
        step.persist(new_p, [f"param {k}" for k in range(N_STEPS)])
    loop.run([(0, N_STEPS)], sync=[1], sync_every=1)
    return graph


def test_an_optimizer_step_recorded_0_in_a_sync_template_counts_as_the_training_step_it_follows():
    values = evaluate_persisted(record_adam_in_sync(0))
    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.Adam([param], lr=LR)
    for k in range(N_STEPS):
        param.grad = torch.as_tensor(GRADS[k])
        opt.step()
        assert torch.equal(values[f"param {k}"], param.detach()), k


def test_counter_0_stays_refused_outside_a_sync_template():
    with pytest.raises(ShapeError, match="step must be a positive int"):
        R.Graph(name="adam 0", seed=1)
        p = R.t(np.ones(3, dtype=np.float32))
        R.adam_step(p, p, p, p, p, step=0)
    R.Graph(name="adam 0 in a training step", seed=1)
    p = R.t(np.ones(3, dtype=np.float32))
    loop = Loop([p])
    with pytest.raises(ShapeError, match="step must be a positive int"):
        with loop.step() as step:
            step.carry([R.adam_step(step.carried[0], p, p, p, p, step=0)[0]])


def test_a_step_recorded_0_that_runs_before_any_training_step_is_refused_when_it_runs():
    graph = R.Graph(name="adam 0 first", seed=1)
    p = R.t(np.ones(3, dtype=np.float32))
    loop = Loop([p])
    with loop.step(counts=False) as step:   # in the schedule, first: no training step before it
        new = R.adam_step(step.carried[0], p, p, p, p, step=0)[0]
        step.carry([new])
        step.persist(new, ["p"])
    with loop.step() as step:
        step.carry(step.carried)
    loop.run([(0, 1), (1, 1)])
    with pytest.raises(Exception, match="step must be a positive int"):
        evaluate_persisted(graph)


SHARED, P = 123457, 0.4


def record_two_templates(shared=True):
    """A loop of N_STEPS training steps, each followed by two sync templates that draw a dropout mask from the
    seed SHARED (one also from another seed); persists the masks of every run."""
    graph = R.Graph(name="shared stream", seed=9)
    ones = R.t(np.ones((6, 5), dtype=np.float32))
    loop = Loop([R.zeros(shape=(), dtype="float32")])
    with loop.step() as step:
        step.carry(step.carried)
    for name in ("forward", "backward"):
        with loop.step(counts=False) as step:
            if shared:
                step.seed_by_step([SHARED])
            step.persist(R.dropout_backward(ones, p=P, seed=SHARED), [f"{name} {k}" for k in range(N_STEPS)])
            if name == "backward":
                step.persist(R.dropout_backward(ones, p=P, seed=SHARED + 1), [f"other {k}" for k in range(N_STEPS)])
            step.carry(step.carried)
    loop.run([(0, N_STEPS)], sync=[1, 2], sync_every=1)
    return graph


def test_two_templates_sharing_a_seed_draw_the_same_masks_at_each_step_and_new_ones_at_the_next():
    values = evaluate_persisted(record_two_templates())
    ones = torch.ones(6, 5)
    for k in range(N_STEPS):
        want = _dropout_noise(ones, P, torch.Generator().manual_seed(step_seed(SHARED, k + 1)))
        assert torch.equal(values[f"forward {k}"], want) and torch.equal(values[f"backward {k}"], want), k
        assert step_seed(SHARED, k + 1) == op_seed(SHARED, k + 1)
        assert not torch.equal(values[f"other {k}"], want)   # only the seed named shares the stream
    masks = {values[f"forward {k}"].numpy().tobytes() for k in range(N_STEPS)}
    assert len(masks) == N_STEPS   # a new mask per training step


def test_without_seed_by_step_the_seed_param_stays_as_recorded():
    values = evaluate_persisted(record_two_templates(shared=False))
    first = values["forward 0"]
    assert all(torch.equal(values[f"{name} {k}"], first) for name in ("forward", "backward")
               for k in range(N_STEPS))


def test_an_op_following_its_own_stream_keeps_it_unless_its_seed_names_a_shared_one():
    """A TorchScript forward seeds its own dropout with its own stream's seed (`op_seed(graph seed, its id)`) and
    follows that stream per run, as before; an op listed as following itself with any other seed (seed_by_step)
    draws the stream that seed names, per training step."""
    from ravop.core import registry
    from ravop.runtime.runner import At, PerRun, stream_id
    graph_seed, node_id, at = 7, 40, At(trained=3, step_index=9, run=2)
    follow = PerRun(registry.REGISTRY["dropout_backward"], graph_seed, "cpu", node_id, None, None, (node_id, None))

    def seed_given(recorded):
        return follow(lambda g, p, seed: seed, [None], {"p": 0.5, "seed": recorded}, at)
    own = op_seed(graph_seed, node_id)
    assert seed_given(own) == op_seed(graph_seed, stream_id(node_id, None, at))
    assert seed_given(SHARED) == step_seed(SHARED, 3)

