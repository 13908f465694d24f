"""Run a checked subgraph with the shared interpreter loop, under torch.no_grad(), freeing each intermediate
after its last reader; each output is checked against its declared size and the worker's memory budget as
it is produced (worker/memory.py); a kernel error names the op that raised it, and running out of memory also
names the device and the sizes involved."""
import torch
from torch import Tensor

from ravop.dtypes import NAMES
from ravop.interpreter import run_nodes

from . import memory


OVER_BUDGET = "over memory budget"  # the dead-letter reason of a value or allocation past the budget


class KernelError(Exception):
    """An op's kernel raised, returned something other than a tensor, or produced more than it declared or the
    worker's budget allows; `node` is its `worker.validate.Step` (op, source line)."""

    def __init__(self, node, message, reason="kernel error"):
        super().__init__(message)
        self.node = node
        self.reason = reason  # for the dead-letter stream


def _input_sizes(step, env):
    shown = ", ".join(f"{tuple(t.shape)} {NAMES.get(t.dtype, t.dtype)}" if isinstance(t, Tensor) else "?"
                      for t in (env.get(i) for i in step.inputs))
    return f"inputs {shown or 'none'}"


class _Cursor:
    """The steps as `run_nodes` iterates them, remembering the current one, so that a kernel error can be
    reported with its op and source line without a second copy of the interpreter loop; when `run_nodes`
    asks for the next step, the output of the previous one is checked."""

    def __init__(self, steps, env, budget):
        self.steps, self.env, self.budget = steps, env, budget
        self.current = None

    def __iter__(self):
        env, budget = self.env, self.budget
        for step in self.steps:
            self.current = step
            yield step
            value = env.get(step.id)
            # The common case in one comparison (about 0.2 us an op); the full check only past the declared size.
            if isinstance(value, Tensor) and value.nbytes > step.bytes:
                problem = memory.oversized(step, value, budget)
                if problem is not None:
                    raise KernelError(step, problem, OVER_BUDGET)


def run(program, inputs, seed, device, budget):
    """{output id: tensor} of a `worker.validate.Program`; `inputs` maps input ids to tensors on `device`;
    `budget`: the bytes one value may take (see worker/memory.py)."""
    env = dict(inputs)
    cursor = _Cursor(program.steps, env, budget)
    try:
        with torch.no_grad():
            run_nodes(cursor, env, seed, device, program.last_use)
    except KernelError:
        raise
    except Exception as exc:  # whatever the kernel raised is the user's error: report it, with their line
        step = cursor.current
        problem = memory.allocation_failure(step, exc, budget)
        if problem is not None:  # the inputs are still in env: the failing op had not consumed them
            message = f"out of memory on {device} at op {step.op!r} ({_input_sizes(step, env)}): {problem}"
            env.clear()  # the traceback keeps this frame: let the worker free the intermediates now
            raise KernelError(step, message, OVER_BUDGET) from exc
        raise KernelError(step, describe(exc, step)) from exc
    outputs = {o: env[o] for o in program.outputs}
    for o, value in outputs.items():
        if not isinstance(value, torch.Tensor):
            node = next(step for step in program.steps if step.id == o)
            raise KernelError(node, f"returned {type(value).__name__}, not a tensor")
    return outputs


def describe(exc, step):
    """`exc` in one line; one that carries no message (a bare StopIteration from odd params) says so."""
    text = str(exc).strip()
    if text:
        return f"{type(exc).__name__}: {text}"
    params = ", ".join(f"{k}={v!r}" for k, v in step.params.items()) or "no params"
    return f"{type(exc).__name__} with no message, raised by the kernel with {params[:300]}"
