"""A step template on a CUDA device captured as one CUDA graph: its kernels launched by one `replay()` instead
of one Python call each, for steps whose time is kernel launches.

A captured graph replays the same kernels on the same memory with the same scalars, so a step can be captured
only if nothing about it changes on the host from run to run (`blockers` says what does): ops that draw from a
host generator or read a step counter or seed (`PerRun`: random ops, optimizer steps with their `step`, a
dropout's backward), and a device that is not CUDA. A worker's memory watcher looks at the outputs of the plain
run that the capture is checked against; the graph's replays make outputs of the same shapes in the memory the
capture allocated once.
Such a step runs as the step compiler chose. A capturable step is a pure function of its inputs (the in-place
optimizer updates all count steps), so the captured graph is checked once against the plain step on the same
inputs, bit for bit, before it is used; a capture that fails or differs is logged and the step runs plain.

`CapturedStep` copies each run's inputs into the graph's static input tensors, replays, and hands out the
graph's static outputs (the step's next carried values are copied into the inputs at the next run, so they are
never overwritten while read). The graph class is a parameter so that the plumbing is tested on a CPU with a
stand-in that runs the recorded function again (tests/runtime/test_step_capture.py); with a GPU it is
`torch.cuda.CUDAGraph` (not measured yet: no GPU was lent when this was written).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch

from .runner import At, Runner

log = logging.getLogger(__name__)


def blockers(runner: Runner) -> list[str]:
    """Why `runner`'s step cannot be captured as a CUDA graph (empty: it can)."""
    reasons = []
    if not runner.device.startswith("cuda"):
        reasons.append(f"runs on {runner.device}, not a CUDA device")
    varying = sorted({runner.nodes[index].op for index, call in enumerate(runner.calls) if call[5] is not None})
    if varying:
        reasons.append(f"ops change per run on the host (random draws, step counters, seeds): {', '.join(varying)}")
    return reasons


class CapturedStep:
    """`runner`'s calls recorded once into a graph (`graph_class()`, used as `torch.cuda.CUDAGraph`: `capture`
    is a context manager factory given the graph, `replay()` runs it) over static copies of its inputs."""

    def __init__(self, runner: Runner, input_slots: list[int], output_slots: list[int],
                 graph_class: Callable[[], Any], capture: Callable[[Any], Any],
                 warm_up: Optional[Callable[[Callable[[], Any]], None]] = None) -> None:
        self.runner, self.input_slots, self.output_slots = runner, list(input_slots), list(output_slots)
        values = runner.values
        self.static_inputs = [values[s].clone() for s in self.input_slots]
        for s, static in zip(self.input_slots, self.static_inputs):
            values[s] = static
        if warm_up is not None:   # CUDA: a few runs on a side stream before capturing (torch's recipe)
            warm_up(lambda: runner.run(None))
        self.graph = graph_class()
        with capture(self.graph):
            out = runner.run(None)
            self.static_outputs = [out[s] for s in self.output_slots]

    def run(self, at: Optional[At]) -> list[Any]:
        values = self.runner.values
        for s, static in zip(self.input_slots, self.static_inputs):
            given = values[s]
            if given is not static:
                static.copy_(given)
                values[s] = static
        self.graph.replay()
        for s, value in zip(self.output_slots, self.static_outputs):
            values[s] = value.clone()   # the next replay overwrites the static ones; persisted values are kept
        return values


def cuda_capture(runner: Runner, input_slots: list[int], output_slots: list[int]) -> Optional[CapturedStep]:
    """A `CapturedStep` of `runner` with torch's CUDA graphs, checked against the plain step on the current
    inputs; None (the reason logged) where it cannot be captured or its bits differ."""
    reasons = blockers(runner)
    if reasons:
        log.info("step not captured as a CUDA graph: %s", "; ".join(reasons))
        return None
    values = runner.values
    kept = list(values)   # a kernel error drops the runner's values (its outer inputs too): restored below
    given = [values[s] for s in input_slots]
    try:
        plain = [v.clone() if isinstance(v, torch.Tensor) else v for v in
                 (runner.run(None)[s] for s in output_slots)]
        for s, value in zip(input_slots, given):
            values[s] = value

        def warm_up(run: Callable[[], Any]) -> None:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    run()
            torch.cuda.current_stream().wait_stream(stream)

        step = CapturedStep(runner, input_slots, output_slots, torch.cuda.CUDAGraph, torch.cuda.graph, warm_up)
        for s, value in zip(input_slots, given):
            values[s] = value
        got = step.run(None)
        if not all(torch.equal(a, got[s]) if isinstance(a, torch.Tensor) else a == got[s]
                   for a, s in zip(plain, output_slots)):
            log.warning("step not captured as a CUDA graph: its replay's bits differ from the plain step's")
            return None
        return step
    except Exception as exc:   # a kernel that syncs with the host, an allocation the capture refuses, ...
        log.warning("step not captured as a CUDA graph: %s: %s", type(exc).__name__, exc)
        runner.values = values
        values[:] = kept
        return None
    finally:
        for s, value in zip(input_slots, given):
            values[s] = value
