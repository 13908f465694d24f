"""Learning-rate schedules inside the optimizer step ops (ravop/ops/lr_schedule.py, ravdl/v2/lr_schedules.py):
a fit folded into one loop equals eager PyTorch with the torch.optim.lr_scheduler of the same name stepped after
every optimizer step; the plan is the same size with or without a schedule; replicas of a strategy schedule
their own steps; bad schedules are refused by name, at record time and on the worker."""
import copy

import pytest
import torch

from compiler.compile import compile_graph
from ravdl.v2.lr_schedules import CosineAnnealingLR, ExponentialLR, LinearLR, SequentialLR, StepLR
from ravdl.v2.optimizers import Adam, AdamW, RMSprop
import ravop as R
from ravop.ops.lr_schedule import check_schedule, scheduled_lr
from ravop.runtime.evaluate import evaluate_persisted
from test_diloco import PARAM_NAMES
from test_parallel_math import LR, X, Y, batches_of, ravdl_net, torch_net

SCHEDULES = {
    "step": (lambda: StepLR(step_size=3, gamma=0.5), lambda opt: torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)),
    "exponential": (lambda: ExponentialLR(0.9), lambda opt: torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)),
    "cosine": (lambda: CosineAnnealingLR(T_max=10, eta_min=0.001),
               lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10, 0.001)),
    "warmup": (lambda: LinearLR(0.1, 1.0, total_iters=4),
               lambda opt: torch.optim.lr_scheduler.LinearLR(opt, 0.1, 1.0, total_iters=4)),
    "warmup+cosine": (lambda: SequentialLR([LinearLR(0.2, total_iters=3), CosineAnnealingLR(T_max=8)], [3]),
                      lambda opt: torch.optim.lr_scheduler.SequentialLR(
                          opt, [torch.optim.lr_scheduler.LinearLR(opt, 0.2, total_iters=3),
                                torch.optim.lr_scheduler.CosineAnnealingLR(opt, 8)], [3])),
}
OPTIMIZERS = {"Adam": (Adam, torch.optim.Adam), "AdamW": (AdamW, torch.optim.AdamW),
              "RMSprop": (RMSprop, torch.optim.RMSprop)}


def scheduled_model(optimizer, schedule):
    model = ravdl_net(torch_net())
    model.optimizer = optimizer(lr=LR, lr_schedule=schedule)
    return model


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_scheduled_fit_equals_eager_pytorch_with_its_scheduler(optimizer, schedule):
    ours, theirs = SCHEDULES[schedule]
    graph = R.Graph(name="schedule", seed=1)
    model = scheduled_model(OPTIMIZERS[optimizer][0], ours())
    names = list(model.fit(X, Y, n_epochs=3, batch_size=10, shuffle=True, seed=2))   # 15 steps
    model.persist_weights()
    model.predict(X).persist_op("prediction")
    values = evaluate_persisted(graph)
    net = torch_net()
    opt = OPTIMIZERS[optimizer][1](net.parameters(), lr=LR)
    scheduler = theirs(opt)
    for name, rows in zip(names, batches_of(len(X), 10, 3, True, 2)):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(torch.as_tensor(X)[rows]), torch.as_tensor(Y)[rows])
        loss.backward()
        opt.step()
        scheduler.step()
        assert torch.allclose(values[name], loss.detach(), atol=1e-6), name
    for name, p in zip(PARAM_NAMES, [net[0].weight, net[0].bias, net[2].weight, net[2].bias]):
        assert (values[name] - p.detach()).abs().max() <= 1e-6, name
    with torch.no_grad():
        assert (values["prediction"] - net.eval()(torch.as_tensor(X))).abs().max() <= 1e-6   # the eval output
    unscheduled = torch_net()
    assert (unscheduled[0].weight - net[0].weight).abs().max() > 1e-3   # it trained


def plan_size(schedule):
    graph = R.Graph(name="plan", seed=1)
    model = scheduled_model(Adam, schedule)
    model.fit(X, Y, n_epochs=4, batch_size=8)
    model.persist_weights()
    plan = compile_graph(graph).plan
    return sum(len(s.nodes.id) + sum(len(t.nodes.id) for t in s.loop.templates) for s in plan.subgraphs)


def test_a_schedule_adds_no_op_to_the_plan():
    assert plan_size(CosineAnnealingLR(T_max=24)) == plan_size(None)


def test_diloco_replicas_schedule_their_own_steps_across_rounds():
    """Each replica's inner Adam counts its own steps, kept across rounds: the schedule continues where the
    round before left it, as one torch scheduler per replica."""
    graph = R.Graph(name="scheduled diloco", seed=11)
    model = scheduled_model(Adam, StepLR(step_size=4, gamma=0.5))
    strategy = R.parallel.DiLoCo(2, 3, outer_lr=1.0, outer_momentum=0.0, nesterov=False)
    names = list(model.fit(X, Y, n_epochs=2, batch_size=6, strategy=strategy))
    values = evaluate_persisted(graph)
    net = torch_net()
    nets = [copy.deepcopy(net) for _ in range(2)]
    opts = [torch.optim.Adam(n.parameters(), lr=LR) for n in nets]
    schedulers = [torch.optim.lr_scheduler.StepLR(o, 4, 0.5) for o in opts]
    shards = [(torch.as_tensor(X[r * 24:(r + 1) * 24]), torch.as_tensor(Y[r * 24:(r + 1) * 24])) for r in range(2)]
    plan = list(batches_of(24, 6, 2, False, 0))
    for k, rows in enumerate(plan):
        for r, (Xs, ys) in enumerate(shards):
            opts[r].zero_grad()
            loss = torch.nn.functional.mse_loss(nets[r](Xs[rows]), ys[rows])
            loss.backward()
            opts[r].step()
            schedulers[r].step()
            e, b = divmod(k, 4)
            assert torch.allclose(values[f"training_loss_epoch_{e + 1}_batch_{b * 2 + r + 1}"], loss.detach(),
                                  atol=1e-6)
        if (k + 1) % 3 == 0 or k + 1 == len(plan):   # outer_lr=1, no momentum: the replicas' mean
            with torch.no_grad():
                for ps in zip(*(n.parameters() for n in nets)):
                    mean = torch.stack(ps).mean(0)
                    for p in ps:
                        p.copy_(mean)
    assert len(names) == 16


def test_the_closed_forms_are_torchs():
    assert scheduled_lr(0.1, None, 5) == 0.1
    assert scheduled_lr(0.1, StepLR(2, 0.5).spec, 5) == pytest.approx(0.1 * 0.25)   # after 4 scheduler steps
    assert scheduled_lr(1.0, CosineAnnealingLR(4).spec, 5) == pytest.approx(0.0, abs=1e-12)   # T_max steps later
    assert scheduled_lr(1.0, CosineAnnealingLR(4).spec, 9) == pytest.approx(1.0)   # and back up, as torch's


@pytest.mark.parametrize("bad, match", [
    ({"kind": "cyclic"}, "must be one of"), ({"kind": "step", "step_size": 0, "gamma": 0.1}, "positive int"),
    ({"kind": "step", "step_size": 2}, "fields"), ({"kind": "exponential", "gamma": float("nan")}, "gamma"),
    ({"kind": "sequential", "schedules": [{"kind": "exponential", "gamma": 0.5}], "milestones": [3]}, "milestones"),
    ("cosine", "must be one of")])
def test_bad_schedules_are_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        check_schedule(bad)
    R.Graph(name="bad schedule")
    with pytest.raises(ValueError, match=match):   # at record time, as a worker would refuse it
        R.adam_step(R.t([1.0]), R.t([1.0]), R.t([0.0]), R.t([0.0]), R.t([0.0]), step=1, lr_schedule=bad)
    with pytest.raises(TypeError, match="lr_schedule takes"):
        Adam(lr_schedule={"kind": "exponential", "gamma": 0.5})
