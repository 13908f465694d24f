"""Dead-code elimination: keep only the nodes the persisted outputs and the loops need (dask's `cull`), and in each
loop template only the ops its carried values and persisted values need."""
from .templates import followed_streams, keep_only, rewrite_templates


def eliminate_dead_code(ir):
    """Returns (ir, number of nodes removed, in the graph and its loop templates)."""
    nodes = ir.nodes
    live = set(ir.roots())
    for id in reversed(nodes):  # readers come after their inputs, so one backward sweep finds them all
        if id in live:
            live.update(nodes[id].inputs)
    loops, culled = rewrite_templates(ir.loops, _cull_template)
    if len(live) == len(nodes) and not culled:
        return ir, 0
    kept = {id: node for id, node in nodes.items() if id in live}
    constants = {id: value for id, value in ir.constants.items() if id in live}
    return ir.replace(nodes=kept, constants=constants, loops=loops), len(nodes) - len(kept) + culled


def _cull_template(template):
    """(template, ops removed): an op whose seed param follows another op's stream keeps that op, which the
    runner needs to name the stream."""
    live = set(template.carry_next) | set(template.output_nodes)
    follows = followed_streams(template)
    for node in reversed(template.nodes):
        if node.id in live:
            live.update(node.inputs)
            if node.id in follows:
                live.add(follows[node.id])
    kept = [node for node in template.nodes if node.id in live]
    if len(kept) == len(template.nodes):
        return template, 0
    return keep_only(template, kept), len(template.nodes) - len(kept)
