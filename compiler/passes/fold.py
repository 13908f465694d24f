"""Constant folding: a deterministic op whose inputs are all constants, and whose result is small, is
computed now (with the same kernels a worker runs) and becomes a constant with the same node id.

Folding is for constant expressions (`alpha / m`, a transposed constant weight), not for running the
user's program in the requester: a whole training loop on small constant tensors is "constant" too. So
the results must be small (they are uploaded instead of their inputs) and the work folded in one compile
is bounded by the cost model's estimate; what does not fit is left to the workers, in id order, so the
plan does not depend on the machine. Data-dependent shapes (-1) are left to the workers, and so is any op
whose kernel raises or returns something other than what was declared: the worker reports that error with
the op's source line, exactly as it would without folding. Folding computes on one torch thread, as the embedded
workers run: the requester's thread count must not change a folded value's bits (a reduction split among two
threads rounds otherwise; found by the differential matrix, tests/differential/test_differential_engine.py).

Inside a loop template the same rule applies to an op that reads only constants: it computes the same value at
every run, so it is computed once, here, and the step reads it as an input of the loop."""
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator, Mapping, Optional

import torch

from ravop.core import registry
from ravop.core.alignment import aligned
from ravop.core.loop_template import LoopRecord, StepTemplate
from ravop.core.node import Node
from ravop.core.sizes import numel
from ravop.runtime.runner import run_op

from ..cost import node_seconds
from ..ir import IR
from .templates import keep_only

MAX_ELEMENTS = 4096
BUDGET_SECONDS = 0.002  # estimated work folded per compile: a fraction of one subgraph's minimum


def fold_constants(ir: IR, max_elements: int = MAX_ELEMENTS, budget_seconds: float = BUDGET_SECONDS
                   ) -> tuple[IR, int]:
    """Returns (ir, number of nodes turned into constants)."""
    with _one_torch_thread():
        return _fold(ir, max_elements, budget_seconds)


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _fold(ir: IR, max_elements: int, budget_seconds: float) -> tuple[IR, int]:
    # id -> tensor (a tuple of tensors for a multi-output node computed here); a constant made from a slice of the
    # user's array is read as a worker reads it from the store: aligned (ravop/core/alignment.py)
    values = {id: aligned(value) for id, value in ir.constants.items()}
    folded: dict[int, Any] = {}
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
    loops = dict(ir.loops)
    hoisted: dict[int, tuple[Node, Any]] = {}
    inputs_of: dict[int, tuple[int, ...]] = {}
    for loop_id, record in ir.loops.items():
        if loop_id not in nodes:
            continue
        templates: list[StepTemplate] = []
        added: list[int] = []
        outer = dict(zip(record.spec.outer_ids, nodes[loop_id].inputs))   # name in the templates -> graph id
        for template in record.spec.templates:
            template, made, budget_seconds = _fold_in_template(template, outer, values, nodes, loop_id, ir.seed,
                                                               max_elements, budget_seconds)
            templates.append(template)
            added += made
            hoisted.update(made)
        if added:
            loops[loop_id] = LoopRecord(replace(record.spec, templates=templates,
                                                outer_ids=[*record.spec.outer_ids, *added]), record.names)
            inputs_of[loop_id] = (*nodes[loop_id].inputs, *added)
    if not folded and not hoisted:
        return ir, 0
    new_nodes = {id: (node.as_constant() if id in folded else
                      node.with_inputs(inputs_of[id]) if id in inputs_of else node)
                 for id, node in nodes.items()}
    if hoisted:   # a template's op becomes a constant under its own id, which is free in the graph
        new_nodes.update((id, node.as_constant()) for id, (node, _) in hoisted.items())
        new_nodes = dict(sorted(new_nodes.items()))
    constants = {**ir.constants, **folded, **{id: value for id, (_, value) in hoisted.items()}}
    return ir.replace(nodes=new_nodes, constants=constants, loops=loops), len(folded) + len(hoisted)


def _fold_in_template(template: StepTemplate, outer: dict[int, int], values: dict[int, Any],
                      nodes: dict[int, Node], loop_id: int, seed: int, max_elements: int, budget_seconds: float
                      ) -> tuple[StepTemplate, dict[int, tuple[Node, Any]], float]:
    """(template, {id: Node} of its ops computed now, budget left): an op of a loop step that reads only
    constants (through the loop's inputs) computes the same value at every run, so it is folded as a graph op
    would be, and the step reads it as one more input of the loop. Ops that change per run (step counters,
    seeds) stay, and so does an op whose id the graph uses (a folded loop reuses its steps' ids)."""
    per_run = {*template.counter_nodes, *(f.node for f in template.seed_followers),
               *(f.source for f in template.seed_followers), *(s.node for s in template.seeded)}
    known = {name: values[i] for name, i in outer.items() if i in values}
    shaped = {**{name: nodes[i] for name, i in outer.items()}, **template.holes}
    made: dict[int, tuple[Node, Any]] = {}
    for node in template.nodes:
        shaped[node.id] = node
        if node.id in per_run or node.id in nodes or node.id >= loop_id or node.op in registry.INPUTS:
            continue
        if not all(i in known for i in node.inputs) or not _small_and_deterministic(node, max_elements):
            continue
        seconds = node_seconds(node, shaped)
        if seconds > budget_seconds:
            continue
        value = _evaluate(node, known, seed)
        if value is None:
            continue
        budget_seconds -= seconds
        known[node.id] = value
        if not node.multi_output:   # a multi-output op stays; its tuple_gets fold
            made[node.id] = (node, value)
    if not made:
        return template, {}, budget_seconds
    kept = [node for node in template.nodes if node.id not in made]
    return keep_only(template, kept), made, budget_seconds


def _outputs(node: Node) -> tuple[Any, Any]:
    """(shapes, dtypes) of every output of the node."""
    return (node.shape, node.dtype) if node.multi_output else ((node.shape,), (node.dtype,))


def _small_and_deterministic(node: Node, max_elements: int) -> bool:
    if not registry.REGISTRY[node.op].deterministic:
        return False
    sizes = [numel(s) for s in _outputs(node)[0]]
    return min(sizes, default=0) >= 0 and sum(sizes) <= max_elements


def _evaluate(node: Node, values: Mapping[int, Any], seed: int) -> Optional[Any]:
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
