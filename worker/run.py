"""Run a checked subgraph with the shared interpreter loop, under torch.no_grad(), freeing each intermediate
after its last reader; a kernel error names the op that raised it, and running out of memory also names
the sizes involved."""
import torch

from ravop.dtypes import NAMES
from ravop.interpreter import run_nodes


class KernelError(Exception):
    """An op's kernel raised (or returned something other than a tensor); `node` is its
    `worker.validate.Step` (op, source line); `out_of_memory` if it could not allocate."""

    def __init__(self, node, message, out_of_memory=False):
        super().__init__(message)
        self.node = node
        self.out_of_memory = out_of_memory


def out_of_memory(exc):
    """A CUDA allocation failure, or the CPU allocator's (a plain RuntimeError)."""
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "can't allocate memory" in str(exc)


def _sizes(step, env):
    inputs = [env.get(i) for i in step.inputs]
    shown = ", ".join(f"{tuple(t.shape)} {NAMES.get(t.dtype, t.dtype)}" if isinstance(t, torch.Tensor) else "?"
                      for t in inputs)
    return f"inputs {shown or 'none'}, declared output {tuple(step.shape)} {step.dtype or '(several)'}"


class _Cursor:
    """The steps as `run_nodes` iterates them, remembering the current one, so that a kernel error can be
    reported with its op and source line without a second copy of the interpreter loop."""

    def __init__(self, steps):
        self.steps = steps
        self.current = None

    def __iter__(self):
        for step in self.steps:
            self.current = step
            yield step


def run(program, inputs, seed, device):
    """{output id: tensor} of a `worker.validate.Program`; `inputs` maps input ids to tensors on `device`."""
    env = dict(inputs)
    cursor = _Cursor(program.steps)
    try:
        with torch.no_grad():
            run_nodes(cursor, env, seed, device, program.last_use)
    except Exception as exc:  # whatever the kernel raised is the user's error: report it, with their line
        step, message = cursor.current, f"{type(exc).__name__}: {exc}"
        if out_of_memory(exc):  # the inputs are still in env: the failing op had not consumed them
            message = f"out of memory on {device} at op {step.op!r} ({_sizes(step, env)}): {message}"
            env.clear()  # the traceback keeps this frame: let the worker free the intermediates now
            raise KernelError(step, message, out_of_memory=True) from exc
        raise KernelError(step, message) from exc
    outputs = {o: env[o] for o in program.outputs}
    for o, value in outputs.items():
        if not isinstance(value, torch.Tensor):
            node = next(step for step in program.steps if step.id == o)
            raise KernelError(node, f"returned {type(value).__name__}, not a tensor")
    return outputs
