"""Dead-code elimination: keep only the nodes the persisted outputs and the loops need (dask's `cull`), and in each
loop template only the ops its carried values and persisted values need; a loop's inputs its templates no longer
read are dropped with them."""
from dataclasses import replace
from typing import Sequence

from ravop.core.loop_template import LoopRecord, StepTemplate
from ravop.core.node import Node

from ..ir import IR

from .templates import followed_streams, keep_only, rewrite_templates


def eliminate_dead_code(ir: IR) -> tuple[IR, int]:
    """Returns (ir, number of nodes removed, in the graph and its loop templates)."""
    loops, culled = rewrite_templates(ir.loops, _cull_template)
    nodes, loops, unread = _drop_unread_loop_inputs(ir.nodes, loops)
    live = set(ir.roots())
    for id in reversed(nodes):  # readers come after their inputs, so one backward sweep finds them all
        if id in live:
            live.update(nodes[id].inputs)
    if len(live) == len(nodes) and not culled and not unread:
        return ir, 0
    kept = {id: node for id, node in nodes.items() if id in live}
    constants = {id: value for id, value in ir.constants.items() if id in live}
    return ir.replace(nodes=kept, constants=constants, loops=loops), len(nodes) - len(kept) + culled


def _drop_unread_loop_inputs(nodes: dict[int, Node], loops: dict[int, LoopRecord]
                             ) -> tuple[dict[int, Node], dict[int, LoopRecord], int]:
    """(nodes, loops, inputs dropped): a loop's inputs beyond its carried values that no template reads (its
    ops were culled or folded) are no inputs of the loop op any more, so what computes them may be culled."""
    changed: dict[int, tuple[LoopRecord, Sequence[int]]] = {}   # loop id -> (record, inputs)
    for loop_id, record in loops.items():
        spec = record.spec
        read: set[int] = set()
        for template in spec.templates:
            for node in template.nodes:
                read.update(node.inputs)
            read.update((*template.outer_reads(), *template.results()))
        keep = [k for k, name in enumerate(spec.outer_ids) if k < spec.n_carried or name in read]
        if len(keep) == len(spec.outer_ids) or loop_id not in nodes:
            continue
        inputs = nodes[loop_id].inputs
        changed[loop_id] = (LoopRecord(replace(spec, outer_ids=[spec.outer_ids[k] for k in keep]), record.names),
                            tuple(inputs[k] for k in keep))
    if not changed:
        return nodes, loops, 0
    nodes, loops = dict(nodes), dict(loops)
    dropped = 0
    for loop_id, (record, inputs) in changed.items():
        dropped += len(nodes[loop_id].inputs) - len(inputs)
        loops[loop_id], nodes[loop_id] = record, nodes[loop_id].with_inputs(inputs)
    return nodes, loops, dropped


def _cull_template(template: StepTemplate) -> tuple[StepTemplate, int]:
    """(template, ops removed): an op whose seed param follows another op's stream keeps that op, which the
    runner needs to name the stream."""
    live = set(template.results())
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
