"""Common-subexpression elimination: a deterministic op applied twice to the same inputs with the same
params is computed once; readers of the copy read the first one. Random ops are never merged (each draws
its own stream, seeded by its node id), and constants are compared by identity only (hashing tensor data
would cost more than it saves; the recorder already shares scalar constants)."""
from ravop import registry


def eliminate_common_subexpressions(ir):
    """Returns (ir, number of nodes merged into an earlier identical node)."""
    random_ops = {name for name, opdef in registry.REGISTRY.items() if not opdef.deterministic}
    random_ops.add("const")
    first = {}    # (op, input ids, params JSON) -> id of the first such node
    alias = {}    # id of a merged node -> id of the node that replaces it
    nodes = {}
    for id, node in ir.nodes.items():
        inputs = node.inputs
        if alias:
            for i in inputs:
                if i in alias:
                    node = node.with_inputs(tuple([alias.get(i, i) for i in inputs]))
                    inputs = node.inputs
                    break
        if node.op in random_ops:
            nodes[id] = node
            continue
        survivor = first.setdefault((node.op, inputs, node.pkey), id)
        if survivor == id:
            nodes[id] = node
        else:
            alias[id] = survivor
    if not alias:
        return ir, 0
    outputs = {name: alias.get(id, id) for name, id in ir.outputs.items()}
    chained = {v: alias.get(u, u) for v, u in ir.chained.items() if v in nodes}
    return ir.replace(nodes=nodes, outputs=outputs, chained=chained), len(alias)
