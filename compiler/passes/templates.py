"""Passes inside loop templates: a template is a list of `Node`s like the graph's, so dead-code and
common-subexpression elimination apply to it too (compiler/passes/dce.py, cse.py). `rewrite_templates` hands
each template to a rewrite and builds new loop records where it changed one; the recorded graph's records are
never modified."""
from dataclasses import replace
from typing import Callable, Optional

from ravop.core.loop_template import LoopRecord, StepTemplate
from ravop.core.node import Node


def rewrite_templates(loops: dict[int, LoopRecord], rewrite: Callable[[StepTemplate], tuple[StepTemplate, int]]
                      ) -> tuple[dict[int, LoopRecord], int]:
    """(loops with every template `rewrite(template) -> (template, count)` changed, total count)."""
    result: dict[int, LoopRecord] = {}
    total = 0
    for id, record in loops.items():
        templates: list[StepTemplate] = []
        changed = 0
        for template in record.spec.templates:
            new, count = rewrite(template)
            templates.append(new)
            changed += count
        result[id] = LoopRecord(replace(record.spec, templates=templates), record.names) if changed else record
        total += changed
    return result, total


def followed_streams(template: StepTemplate) -> dict[int, int]:
    """{op id: the op whose stream its seed param follows}."""
    return {f.node: f.source for f in template.seed_followers}


def keep_only(template: StepTemplate, nodes: list[Node], alias: Optional[dict[int, int]] = None) -> StepTemplate:
    """`template` with `nodes` (a subset of its nodes, in order) and, with `alias` (merged id -> survivor), its
    results renamed; the per-op lists drop the ops that are gone."""
    alias = alias or {}
    ids = {node.id for node in nodes}
    return replace(template, nodes=nodes,
                   carried=[replace(c, after=alias.get(c.after, c.after)) for c in template.carried],
                   outputs=[replace(o, node=alias.get(o.node, o.node)) for o in template.outputs],
                   sent=[replace(s, node=alias.get(s.node, s.node)) for s in template.sent],
                   counter_nodes=[n for n in template.counter_nodes if n in ids],
                   seeded=[s for s in template.seeded if s.node in ids],
                   seed_followers=[f for f in template.seed_followers if f.node in ids])
