"""Constant folding: a deterministic op whose inputs are all constants, and whose result is small, is
computed now (with the same kernels a worker runs) and becomes a constant with the same node id.

"Small" bounds both what the requester uploads instead (the result) and the time spent here (the cost
model's FLOPs). Data-dependent shapes (-1) are left to the workers, and so is any op whose kernel raises
or returns something other than what was declared: the worker reports that error with the op's source
line, exactly as it would without folding."""
import torch

from ravop import registry
from ravop.interpreter import run_op

from ..cost import node_flops

MAX_ELEMENTS = 4096
MAX_FLOPS = 1e6


def _size(shape):
    n = 1
    for d in shape:
        if d < 0:
            return -1
        n *= d
    return n


def fold_constants(ir, max_elements=MAX_ELEMENTS, max_flops=MAX_FLOPS):
    """Returns (ir, number of nodes turned into constants)."""
    values = dict(ir.constants)  # id -> tensor (a tuple of tensors for a multi-output node computed here)
    folded = {}
    nodes = ir.nodes
    for id, node in nodes.items():
        if node.op == "const":
            continue
        inputs = node.inputs
        if not all([i in values for i in inputs]):
            continue
        opdef = registry.REGISTRY[node.op]
        if not opdef.deterministic:
            continue
        shapes = node.shape if node.multi_output else (node.shape,)
        sizes = [_size(s) for s in shapes]
        if min(sizes, default=0) < 0 or sum(sizes) > max_elements:
            continue
        if node_flops(node, nodes) > max_flops:
            continue
        try:
            with torch.no_grad():
                value = run_op(opdef, [values[i] for i in inputs], node.params, ir.seed, id)
        except Exception:  # any kernel error: left for the worker to report (see the module docstring)
            continue
        if node.multi_output:
            if _matches(value, node):
                values[id] = tuple(value)  # its tuple_get readers fold from here; the node itself stays
            continue
        if _matches((value,), node, single=True):
            values[id] = folded[id] = value.contiguous()
    if not folded:
        return ir, 0
    new_nodes = {id: (node.as_constant(node.shape, node.dtype) if id in folded else node)
                 for id, node in nodes.items()}
    constants = {**ir.constants, **folded}
    chained = {v: u for v, u in ir.chained.items() if v not in folded and u not in folded}
    return ir.replace(nodes=new_nodes, constants=constants, chained=chained), len(folded)


def _matches(values, node, single=False):
    shapes = (node.shape,) if single else node.shape
    dtypes = (node.dtype,) if single else node.dtype
    if not isinstance(values, (tuple, list)) or len(values) != len(shapes):
        return False
    return all(isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(s) and v.dtype == d
               for v, s, d in zip(values, shapes, dtypes))
