"""Run a checked subgraph with the shared interpreter loop, under torch.no_grad(), freeing each intermediate
after its last reader; each output is checked against its declared size and the worker's memory budget as
it is produced (worker/memory.py); a kernel error names the op that raised it, and running out of memory also
names the device and the sizes involved."""
import torch
from torch import Tensor

from ravop.dtypes import NAMES
from ravop.interpreter import OpError, run_nodes

from . import memory


OVER_BUDGET = "over memory budget"  # the dead-letter reason of a value or allocation past the budget


class KernelError(Exception):
    """An op's kernel raised, returned something other than a tensor, or produced more than it declared or the
    worker's budget allows; `node` is its `ravop.node.Node` (op, source line)."""

    def __init__(self, node, message, reason="kernel error"):
        super().__init__(message)
        self.node = node
        self.reason = reason  # for the dead-letter stream


def _input_sizes(step, env):
    shown = ", ".join(f"{tuple(t.shape)} {NAMES.get(t.dtype, t.dtype)}" if isinstance(t, Tensor) else "?"
                      for t in (env.get(i) for i in step.inputs))
    return f"inputs {shown or 'none'}"


def run(program, inputs, seed, device, budget):
    """{output id: tensor} of a `worker.validate.Program`; `inputs` maps input ids to tensors on `device`;
    `budget`: the bytes one value may take (see worker/memory.py)."""
    env = dict(inputs)
    declared = program.declared

    def check(step, value):
        # The common case in one comparison (about 0.2 us an op); the full check only past the declared size.
        if isinstance(value, Tensor) and value.nbytes > declared[step.id]:
            problem = memory.oversized(step, declared[step.id], value, budget)
            if problem is not None:
                raise KernelError(step, problem, OVER_BUDGET)

    try:
        with torch.no_grad():
            run_nodes(program.steps, env, seed, device, program.last_use, check)
    except OpError as exc:  # whatever the kernel raised is the user's error: report it, with their line
        step = exc.node
        problem = memory.allocation_failure(step, declared[step.id], exc.__cause__, budget)
        if problem is not None:  # the inputs are still in env: the failing op had not consumed them
            message = f"out of memory on {device} at op {step.op!r} ({_input_sizes(step, env)}): {problem}"
            env.clear()  # the traceback keeps this frame: let the worker free the intermediates now
            raise KernelError(step, message, OVER_BUDGET) from exc.__cause__
        raise KernelError(step, exc.detail) from exc.__cause__
    outputs = {o: env[o] for o in program.outputs}
    for o, value in outputs.items():
        if not isinstance(value, torch.Tensor):
            node = next(step for step in program.steps if step.id == o)
            raise KernelError(node, f"returned {type(value).__name__}, not a tensor")
    return outputs
