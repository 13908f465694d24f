"""Sync templates that also run once before a loop's first step (`Loop.step(before_first=True)`, plan.proto's
`Loop.before_first`): their run k + 1 follows the k-th sync, which is how DiLoCo's overlap sends an outer step's
update as soon as it is done (ravop/parallel/resident.py; its schedule is tested in test_resident_replicas.py)."""
import pytest
import torch

from compiler import compile_graph
import ravop as R
from ravop.core.errors import PlanError
from ravop.record.loop import Loop
from ravop.runtime.evaluate import evaluate_persisted
from ravop.runtime.loop_run import LoopRun
from ravop.wire import plan_pb2, pack_loop, unpack_loop


def record(before_first=True, steps=5, every=2):
    """x carried; a training step adds 1, a sync template doubles x and persists what it read."""
    graph = R.Graph(name="before first", seed=3)
    loop = Loop([R.t(torch.tensor([1.0]))])
    with loop.step() as step:
        step.carry([step.carried[0] + 1.0])
    with loop.step(counts=False, before_first=before_first) as step:
        n_syncs = -(-steps // every) + before_first
        step.persist(step.carried[0], [f"seen_{k}" for k in range(n_syncs)])
        step.carry([step.carried[0] * 2.0])
    final, = loop.run([(0, steps)], sync=[1], sync_every=every)
    final.persist_op("final")
    return graph


def test_a_before_first_sync_template_runs_first_then_after_every_sync():
    values = evaluate_persisted(record())
    x, seen = 1.0, []
    for k in range(5):   # doubled before the first step, then +1 per step and doubled after steps 2, 4, 5
        if k == 0:
            seen.append(x)
            x *= 2
        x += 1
        if (k + 1) % 2 == 0 or k == 4:
            seen.append(x)
            x *= 2
    assert [float(values[f"seen_{k}"]) for k in range(4)] == seen and float(values["final"]) == x
    plain = evaluate_persisted(record(before_first=False))
    assert [float(plain[f"seen_{k}"]) for k in range(3)] == [3.0, 8.0, 17.0]


def test_the_plan_carries_it_and_a_hostile_plan_is_refused():
    graph = record()
    spec = next(iter(graph.loops.values())).spec
    assert spec.before_first == [1] and spec.runs(1) == 4 and spec.n_steps == 5 + 3 + 1
    message = plan_pb2.Loop()
    pack_loop(spec, message)
    again = unpack_loop(plan_pb2.Loop.FromString(message.SerializeToString()))
    assert again.before_first == [1] and again.n_steps == spec.n_steps
    compiled = compile_graph(graph).plan
    (loop,) = [s.loop for s in compiled.subgraphs if s.HasField("loop")]
    assert list(loop.before_first) == [1]
    inputs = [torch.tensor([1.0])] + [torch.tensor(1.0)] * (len(loop.outer_ids) - 1)   # x, then the constants
    for bad in ([0], [1, 1]):   # a training step, a template twice
        hostile = unpack_loop(loop)
        hostile.before_first = bad
        with pytest.raises(PlanError, match="before its first step"):
            LoopRun(hostile, inputs, 3)
    hostile = unpack_loop(loop)
    hostile.n_steps += 1   # a step more than the schedule, its syncs and the one before the first run
    with pytest.raises(PlanError, match="schedule runs 9"):
        LoopRun(hostile, inputs, 3)


def test_only_a_sync_template_may_run_before_the_first_step():
    R.Graph(name="not a sync")
    loop = Loop([R.t(torch.tensor([1.0]))])
    with loop.step() as step:
        step.carry([step.carried[0] + 1.0])
    with loop.step(counts=False, before_first=True) as step:
        step.carry([step.carried[0] * 2.0])
    with pytest.raises(ValueError, match=r"before_first=True but are not sync templates \[\]"):
        loop.run([(0, 3)])
