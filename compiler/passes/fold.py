"""Constant folding: a deterministic op whose inputs are all constants, and whose result is small, is
computed now (with the same kernels a worker runs) and becomes a constant with the same node id.

Folding is for constant expressions (`alpha / m`, a transposed constant weight), not for running the
user's program in the requester: a whole training loop on small constant tensors is "constant" too. So
the results must be small (they are uploaded instead of their inputs) and the work folded in one compile
is bounded by the cost model's estimate; what does not fit is left to the workers, in id order, so the
plan does not depend on the machine. Data-dependent shapes (-1) are left to the workers, and so is any op
whose kernel raises or returns something other than what was declared: the worker reports that error with
the op's source line, exactly as it would without folding."""
import torch

from ravop import registry
from ravop.runner import run_op
from ravop.sizes import numel

from ..cost import node_seconds

MAX_ELEMENTS = 4096
BUDGET_SECONDS = 0.002  # estimated work folded per compile: a fraction of one subgraph's minimum


def fold_constants(ir, max_elements=MAX_ELEMENTS, budget_seconds=BUDGET_SECONDS):
    """Returns (ir, number of nodes turned into constants)."""
    values = dict(ir.constants)  # id -> tensor (a tuple of tensors for a multi-output node computed here)
    folded = {}
    nodes = ir.nodes
    for id, node in nodes.items():
        if node.op in registry.INPUTS:
            continue
        for i in node.inputs:
            if i not in values:
                break
        else:
            if not _small_and_deterministic(node, max_elements):
                continue
            seconds = node_seconds(node, nodes)
            if seconds > budget_seconds:
                continue
            value = _evaluate(node, values, ir.seed)
            if value is None:
                continue
            budget_seconds -= seconds
            values[id] = value
            if not node.multi_output:  # a multi-output node stays; its tuple_get readers fold
                folded[id] = value
    if not folded:
        return ir, 0
    new_nodes = {id: (node.as_constant() if id in folded else node)
                 for id, node in nodes.items()}
    constants = {**ir.constants, **folded}
    return ir.replace(nodes=new_nodes, constants=constants), len(folded)


def _outputs(node):
    """(shapes, dtypes) of every output of the node."""
    return (node.shape, node.dtype) if node.multi_output else ((node.shape,), (node.dtype,))


def _small_and_deterministic(node, max_elements):
    if not registry.REGISTRY[node.op].deterministic:
        return False
    sizes = [numel(s) for s in _outputs(node)[0]]
    return min(sizes, default=0) >= 0 and sum(sizes) <= max_elements


def _evaluate(node, values, seed):
    """The node's value (a tuple for a multi-output node), or None if its kernel fails or returns
    something other than the declared outputs."""
    try:
        with torch.no_grad():
            value = run_op(registry.REGISTRY[node.op], [values[i] for i in node.inputs], node.params, seed, node.id)
    except Exception:  # any kernel error: left for the worker to report (see the module docstring)
        return None
    shapes, dtypes = _outputs(node)
    outputs = tuple(value) if node.multi_output and isinstance(value, (tuple, list)) else (value,)
    if len(outputs) != len(shapes) or not all(
            isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(s) and v.dtype == d
            for v, s, d in zip(outputs, shapes, dtypes)):
        return None
    return outputs if node.multi_output else value.contiguous()
