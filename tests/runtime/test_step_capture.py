"""CUDA-graph capture of a step template (ravop/runtime/step_capture.py), what can be tested without a GPU: which steps
can be captured, and the plumbing of a captured step (static inputs refreshed each run, outputs handed out as
copies) with a stand-in graph that runs the recorded step again on replay."""
import contextlib
import logging

import torch

from ravop.core import registry
from ravop.core.node import Node
import ravop.ops  # noqa: F401 - registers the ops
from ravop.runtime import step_capture
from ravop.runtime.runner import PerRun, Runner


def pure_step(device="cpu"):
    """carried' = carried * rate + rows.sum(0); loss = carried'.sum(): nothing varies on the host."""
    nodes = [Node(10, "multiply", [0, 2]), Node(11, "sum", [1], {"axis": 0}), Node(12, "add", [10, 11]),
             Node(13, "sum", [12])]
    runner = Runner(nodes, [2, 0, 1], [12, 13], device, free_inputs=False)
    runner.values[runner.slot[2]] = torch.tensor(0.5)   # an outer value: the same tensor every run
    return runner


class StandIn:
    """A CPU stand-in for torch.cuda.CUDAGraph: replay runs the step again and writes its results into the
    outputs recorded at capture, as a replay writes into the same memory."""

    def __init__(self, runner, output_slots):
        self.runner, self.output_slots, self.replays = runner, output_slots, 0

    def replay(self):
        self.replays += 1
        out = self.runner.run(None)
        for static, s in zip(self.captured, self.output_slots):
            static.copy_(out[s])


def test_what_blocks_a_capture():
    runner = pure_step()
    assert step_capture.blockers(runner) == ["runs on cpu, not a CUDA device"]
    adam = Node(20, "adam_step", [0, 1, 2, 3, 4], {**{k: v for k, v in registry.REGISTRY["adam_step"].params.items()
                                                      if v is not registry.REQUIRED}, "step": 1})
    counted = PerRun(registry.REGISTRY["adam_step"], 0, "cpu", 20, None, 1)
    with_counter = Runner([adam], [0, 1, 2, 3, 4], [20], "cpu", per_run={20: counted}, free_inputs=False)
    reasons = step_capture.blockers(with_counter)
    assert any("step counters" in r and "adam_step" in r for r in reasons), reasons


def test_a_captured_step_replays_over_its_static_inputs():
    plain, runner = pure_step(), pure_step()
    inputs, outputs = [runner.slot[0], runner.slot[1]], [runner.slot[12], runner.slot[13]]
    made = []
    carried = torch.arange(4.0)
    runner.values[inputs[0]], runner.values[inputs[1]] = carried, torch.ones(3, 4)
    step = step_capture.CapturedStep(runner, inputs, outputs, lambda: made.append(StandIn(runner, outputs)) or made[-1],
                                     lambda graph: contextlib.nullcontext())
    (graph,) = made
    graph.captured = step.static_outputs
    assert step.static_inputs[0] is not carried and torch.equal(step.static_inputs[0], carried)
    want_carried = got_carried = carried
    for run in range(4):
        rows = torch.full((3, 4), float(run))
        for r, c in ((plain, want_carried), (runner, got_carried)):
            r.values[r.slot[0]], r.values[r.slot[1]] = c, rows
        want = plain.run(None)
        want_carried, want_loss = want[plain.slot[12]].clone(), want[plain.slot[13]].clone()
        got = step.run(None)
        got_carried, got_loss = got[outputs[0]], got[outputs[1]]
        assert torch.equal(got_carried, want_carried) and torch.equal(got_loss, want_loss), run
        assert got_carried is not step.static_outputs[0]   # a copy: the next replay leaves it alone
        assert runner.values[inputs[0]] is step.static_inputs[0]
    assert graph.replays == 4


def test_on_a_cpu_nothing_is_captured_and_the_reason_is_logged(caplog):
    runner = pure_step()
    with caplog.at_level(logging.INFO, logger="ravop.runtime.step_capture"):
        assert step_capture.cuda_capture(runner, [runner.slot[0], runner.slot[1]], [runner.slot[12]]) is None
    assert "not captured as a CUDA graph: runs on cpu" in caplog.text
