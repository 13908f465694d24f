"""Run a checked subgraph with the one runner (`ravop.runtime.runner.Runner`), under torch.no_grad(), freeing each
intermediate after its last reader; each output is checked against its declared size and the worker's memory
budget as it is produced (worker/execute/memory.py). `kernel_error` turns the runner's `OpError` into what the worker
reports, the same for a subgraph's op and a loop step's: the op and the user's line, and for running out of
memory the device and the sizes involved."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ravop.core.dtypes import NAMES
import ravop.ops  # noqa: F401  (defines every op: the registry the runner dispatches on)
from ravop.runtime.runner import OpError, Runner

from . import memory
from .validate import Program, declared_bytes


OVER_BUDGET = "over memory budget"  # the dead-letter reason of a value or allocation past the budget


class KernelError(Exception):
    """An op's kernel raised, returned something other than a tensor, or produced more than it declared or the
    worker's budget allows; `node` is its `ravop.core.node.Node` (op, source line)."""

    def __init__(self, node: Any, message: str, reason: str = "kernel error") -> None:
        super().__init__(message)
        self.node = node
        self.reason = reason  # for the dead-letter stream


def _input_sizes(shapes: list[Any]) -> str:
    shown = ", ".join("?" if s is None else f"{s[0]} {NAMES.get(s[1], s[1])}" for s in shapes)
    return f"inputs {shown or 'none'}"


def kernel_error(exc: OpError, device: Any, budget: int) -> KernelError:
    """What the worker reports for `exc`: an allocation that failed names the device and the sizes, and is
    over the budget like an output past it (the caller drops what it holds for reuse)."""
    step = exc.node
    where = "" if exc.step is None else f" (loop step {exc.step + 1})"
    if exc.over_budget:
        return KernelError(step, exc.detail + where, OVER_BUDGET)
    problem = memory.allocation_failure(step, declared_bytes(step), exc.__cause__, budget)
    if problem is not None:
        return KernelError(step, f"out of memory on {device} at op {step.op!r} ({_input_sizes(exc.input_shapes)}): "
                                 f"{problem}{where}", OVER_BUDGET)
    return KernelError(step, exc.detail + where)


def run(program: Program, inputs: dict[int, Tensor], seed: int, device: Any, budget: int) -> dict[int, Tensor]:
    """{output id: tensor} of a `worker.execute.validate.Program`; `inputs` maps input ids to tensors on `device`;
    `budget`: the bytes one value may take (see worker/execute/memory.py)."""
    runner = program.runner
    if runner is None or runner.device != str(device) or runner.graph_seed != seed:   # checked for another
        runner = Runner(program.steps, inputs, program.outputs, str(device), seed)  # device or seed (tests)
    runner.watcher = memory.Watcher(program, budget)
    values, slot = runner.values, runner.slot
    for i, value in inputs.items():
        values[slot[i]] = value
    try:
        with torch.no_grad():
            values = runner.run()
    except OpError as exc:  # whatever the kernel raised is the user's error: report it, with their line
        raise kernel_error(exc, device, budget) from exc.__cause__
    outputs = {o: values[slot[o]] for o in program.outputs}
    for o, value in outputs.items():
        if not isinstance(value, torch.Tensor):
            node = next(step for step in program.steps if step.id == o)
            raise KernelError(node, f"returned {type(value).__name__}, not a tensor")
    return outputs
