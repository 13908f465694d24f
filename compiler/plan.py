"""Emit the protobuf `Plan` from the IR, its windows and their costs.

Per subgraph: its nodes in order; `inputs`, the ids it reads from the tensor store (other subgraphs'
outputs and constants, in first-read order); `outputs`, the ids it writes there (read by another subgraph,
or persisted); `successors`, the subgraphs that read one of its outputs; `n_predecessors`, how many
subgraphs must finish before it is ready; for a loop op's subgraph (the fills it reads, the loop op, its
tuple_gets), `loop`, its step templates.
"""
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from ravop.core.loss_names import RunNames
from ravop.core.persist_rules import PersistRule
from ravop.core.registry import LOOPS
from ravop.wire import pack_loop, pack_nodes, plan_pb2
from ravop.wire.persisted import add_rule

if TYPE_CHECKING:
    from ravop.core.loop_template import LoopRecord

    from .cost import Costs
    from .ir import IR


def emit_plan(ir: "IR", windows: Sequence[Sequence[int]], costs: "Costs") -> Any:
    """The Plan (its `max_parallel_width` is left for the caller, who has the quotient graph)."""
    nodes = ir.nodes
    where = [-1] * ir.n_recorded  # node id -> its window; -1 for constants
    for w, window in enumerate(windows):
        for v in window:
            where[v] = w
    plan = plan_pb2.Plan(graph_id=ir.graph_id, seed=ir.seed, n_recorded_ops=ir.n_recorded,
                         n_compiled_ops=sum(map(len, windows)))
    plan.persisted.update(ir.outputs)
    outputs: list[list[int]] = [[] for _ in windows]
    emitted = set()  # ids already listed as an output
    successors: list[set[int]] = [set() for _ in windows]
    flops, moved = costs.flops, costs.bytes
    next_id = ir.n_recorded   # values persisted by loop steps get ids after the recorded ops'
    for w, window in enumerate(windows):
        sub = plan.subgraphs.add(id=w, device=ir.device)
        for v in window:   # a fill several loops read is in each of their windows (compiler/partition.py)
            where[v] = w
        inputs: list[int] = []
        seen: set[int] = set()
        sg_flops = sg_bytes = 0.0
        rows = []
        for v in window:
            node = nodes[v]
            for i in node.inputs:
                src = where[i]
                if src != w and i not in seen:
                    seen.add(i)
                    inputs.append(i)
                    if src >= 0:
                        successors[src].add(w)
                        if i not in emitted:
                            emitted.add(i)
                            outputs[src].append(i)
            rows.append(node)
            sg_flops += flops[v]
            sg_bytes += moved[v]
        pack_nodes(rows, sub.nodes)
        head = next((v for v in window if nodes[v].inputs), None)   # a loop's window starts with its fills
        if head is not None and nodes[head].op in LOOPS:
            next_id = _emit_loop(plan, sub.loop, ir.loops[head], next_id)
        plan.flops += sg_flops
        sub.inputs.extend(inputs)
        sub.n_predecessors = len({where[i] for i in inputs if where[i] >= 0})
        sub.flops, sub.bytes = sg_flops, sg_bytes
    for v in set(ir.outputs.values()):
        w = where[v]
        if w >= 0 and v not in emitted:
            outputs[w].append(v)
    for sub, outs, succ in zip(plan.subgraphs, outputs, successors):
        sub.outputs.extend(sorted(outs))
        sub.successors.extend(sorted(succ))
    plan.constants.extend(sorted(ir.constants))
    return plan


def _emit_loop(plan: Any, message: Any, record: "LoopRecord", next_id: int) -> int:
    """Pack a loop subgraph's `loop` from its record, the one place a template becomes protobuf: each value a
    step persists gets one tensor id per run, from `next_id` on, and its names go into the plan's persisted
    map, or its rule (a RunNames) into `persist_rules`: O(1) in the runs. Returns the next free id."""
    spec = record.spec
    templates = []
    for template, names in zip(spec.templates, record.names):
        first_ids = []
        for per_run in names:
            first_ids.append(next_id)
            if isinstance(per_run, RunNames):
                add_rule(plan, PersistRule(per_run, next_id))
            else:
                plan.persisted.update(zip(per_run, range(next_id, next_id + len(per_run))))
            next_id += len(per_run)
        templates.append(replace(template, outputs=[replace(o, first_id=first_id)
                                                    for o, first_id in zip(template.outputs, first_ids)]))
    pack_loop(replace(spec, templates=templates), message)
    plan.n_steps += spec.n_steps
    return next_id
