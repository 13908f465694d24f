"""Dead-code elimination: keep only the nodes the persisted outputs and the loops need (dask's `cull`)."""


def eliminate_dead_code(ir):
    """Returns (ir, number of nodes removed)."""
    nodes = ir.nodes
    live = set(ir.roots())
    for id in reversed(nodes):  # readers come after their inputs, so one backward sweep finds them all
        if id in live:
            live.update(nodes[id].inputs)
    if len(live) == len(nodes):
        return ir, 0
    kept = {id: node for id, node in nodes.items() if id in live}
    constants = {id: value for id, value in ir.constants.items() if id in live}
    return ir.replace(nodes=kept, constants=constants), len(nodes) - len(kept)
