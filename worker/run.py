"""Run a checked subgraph with the shared interpreter loop, under torch.no_grad(), freeing each intermediate
after its last reader; a kernel error names the op that raised it."""
import torch

from ravop.interpreter import run_nodes


class KernelError(Exception):
    """An op's kernel raised (or returned something other than a tensor); `node` is its
    `worker.validate.Step` (op, source line)."""

    def __init__(self, node, message):
        super().__init__(message)
        self.node = node


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
        raise KernelError(cursor.current, f"{type(exc).__name__}: {exc}") from exc
    outputs = {o: env[o] for o in program.outputs}
    for o, value in outputs.items():
        if not isinstance(value, torch.Tensor):
            node = next(step for step in program.steps if step.id == o)
            raise KernelError(node, f"returned {type(value).__name__}, not a tensor")
    return outputs
