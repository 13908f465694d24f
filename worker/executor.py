"""Run one subgraph: validate it against the registry, then interpret its nodes with the shared kernel loop."""
import torch

from ravop import registry
from ravop.dtypes import DTYPES
from ravop.interpreter import run_op
from ravop.wire import decode_params


class SubgraphError(Exception):
    """The subgraph cannot run; `node` is the proto Node at fault (None if the subgraph as a whole is)."""

    def __init__(self, message, node=None):
        super().__init__(message)
        self.node = node


class _Step:
    __slots__ = ("id", "opdef", "inputs", "params", "node")


def prepare(subgraph, max_bytes):
    """Check a subgraph before running anything: known ops, inputs defined before use, declared sizes
    within `max_bytes` in total (so a hostile or oversized plan fails cleanly instead of exhausting memory)."""
    defined = set(subgraph.inputs)
    steps, total = [], 0
    for node in subgraph.nodes:
        opdef = registry.REGISTRY.get(node.op)
        if opdef is None or node.op == "const":
            raise SubgraphError(f"unknown op {node.op!r}", node)
        missing = [i for i in node.inputs if i not in defined]
        if missing:
            raise SubgraphError(f"op {node.op!r} reads undefined values {missing}", node)
        if node.dtype:
            if node.dtype not in DTYPES or any(d < -1 for d in node.shape):
                raise SubgraphError(f"bad declared output {tuple(node.shape)} {node.dtype!r}", node)
            numel = 1
            for d in node.shape:
                numel *= max(d, 1)
            total += numel * torch.empty((), dtype=DTYPES[node.dtype]).element_size()
            if total > max_bytes:
                raise SubgraphError(f"subgraph needs more than {max_bytes / 2**20:.0f} MiB (op {node.op!r} "
                                    f"declares {tuple(node.shape)} {node.dtype}); the worker's limit is "
                                    "--max-subgraph-bytes", node)
        step = _Step()
        step.id, step.opdef, step.inputs, step.node = node.id, opdef, list(node.inputs), node
        try:
            step.params = decode_params(node.params)
        except ValueError as exc:
            raise SubgraphError(str(exc), node) from None
        steps.append(step)
        defined.add(node.id)
    missing = [o for o in subgraph.outputs if o not in defined]
    if missing:
        raise SubgraphError(f"outputs {missing} are not computed by the subgraph")
    return steps


def execute(steps, env, outputs, graph_seed, device):
    """Run `steps` on `env` (node id -> tensor, holding the inputs); return {output id: tensor}. Each
    intermediate is dropped after its last reader."""
    keep = set(outputs)
    last_use = {}
    for index, step in enumerate(steps):
        for i in step.inputs:
            last_use[i] = index
    with torch.no_grad():
        for index, step in enumerate(steps):
            try:
                env[step.id] = run_op(step.opdef, [env[i] for i in step.inputs], step.params, graph_seed,
                                      step.id, device)
            except Exception as exc:  # a kernel error is the user's problem: report it with their line
                raise SubgraphError(f"{type(exc).__name__}: {exc}", step.node) from exc
            for i in step.inputs:
                if last_use[i] == index and i not in keep:
                    env.pop(i, None)
    return {o: env[o] for o in outputs}
