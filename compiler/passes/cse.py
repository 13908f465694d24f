"""Common-subexpression elimination: a deterministic op applied twice to the same inputs with the same
params is computed once; readers of the copy read the first one. Random ops are never merged (each draws
its own stream, seeded by its node id). Constants are content-addressed: two with the same dtype, shape and
bytes are one value, so a user loop that records `R.t(X_batch)` again every epoch uploads each batch once.
Only constants that share a dtype and shape with another are hashed. Inside a loop template the same merging
applies, except to ops that change per run (step counters, seeds) and to the step's carried results (two
carried values must never share a tensor: a loop may update them in place)."""
import hashlib
from collections import Counter
from typing import Any, Collection, Hashable

import torch

from ravop.core import registry
from ravop.core.loop_template import StepTemplate
from ravop.core.node import Node

from ..ir import IR

from .templates import keep_only, rewrite_templates


def _constant_keys(constants: dict[int, Any]) -> dict[int, Hashable]:
    """id -> content key of each constant that has a same-sized twin (the others are unique anyway)."""
    sizes = Counter((t.dtype, tuple(t.shape)) for t in constants.values())
    return {id: (t.dtype, tuple(t.shape),
                 hashlib.blake2b(t.contiguous().reshape(-1).view(torch.uint8).numpy(), digest_size=16).digest())
            for id, t in constants.items() if sizes[(t.dtype, tuple(t.shape))] > 1}


def eliminate_common_subexpressions(ir: IR) -> tuple[IR, int]:
    """Returns (ir, number of nodes merged into an earlier identical node)."""
    random_ops = {name for name, opdef in registry.REGISTRY.items() if not opdef.deterministic}
    inputs_ops = registry.INPUTS
    content = _constant_keys(ir.constants)
    first: dict[Hashable, int] = {}    # (op, input ids, params JSON) or a constant's content key -> id of the first such node
    alias: dict[int, int] = {}    # id of a merged node -> id of the node that replaces it
    nodes: dict[int, Node] = {}
    for id, node in ir.nodes.items():
        inputs = node.inputs
        if alias:
            for i in inputs:
                if i in alias:
                    node = node.with_inputs(tuple([alias.get(i, i) for i in inputs]))
                    inputs = node.inputs
                    break
        key: Hashable = content.get(id) if node.op in inputs_ops else (node.op, inputs, node.pkey)
        if key is None or node.op in random_ops:
            nodes[id] = node
            continue
        survivor = first.setdefault(key, id)
        if survivor == id:
            nodes[id] = node
        else:
            alias[id] = survivor
    loops, merged = rewrite_templates(ir.loops, lambda template: _merge_in_template(template, random_ops))
    if not alias and not merged:
        return ir, 0
    outputs = {name: alias.get(id, id) for name, id in ir.outputs.items()}
    constants = {id: value for id, value in ir.constants.items() if id not in alias}
    return ir.replace(nodes=nodes, outputs=outputs, constants=constants, loops=loops), len(alias) + merged


def _merge_in_template(template: StepTemplate, random_ops: Collection[str]) -> tuple[StepTemplate, int]:
    """(template, ops merged into an earlier identical op)."""
    unmerged = {*template.counter_nodes, *(f.node for f in template.seed_followers),
                *(c.after for c in template.carried)}
    first: dict[Hashable, int] = {}
    alias: dict[int, int] = {}
    nodes: list[Node] = []
    for node in template.nodes:
        if alias and any(i in alias for i in node.inputs):
            node = node.with_inputs(tuple([alias.get(i, i) for i in node.inputs]))
        if node.op in random_ops or node.id in unmerged:
            nodes.append(node)
            continue
        survivor = first.setdefault((node.op, tuple(node.inputs), node.pkey), node.id)
        if survivor == node.id:
            nodes.append(node)
        else:
            alias[node.id] = survivor
    if not alias:
        return template, 0
    return keep_only(template, nodes, alias), len(alias)
