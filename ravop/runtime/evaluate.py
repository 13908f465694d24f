"""In-process evaluation (`evaluate`, `evaluate_persisted`: a reference for tests and debugging) of recorded ops,
loops included, with the one runner workers use (`ravop.runtime.runner`, re-exported here: `run_op`, `run_nodes`,
`op_seed`, `OpError`), so the numbers are a worker's.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import threading

import torch

from ..core import registry
from ..core.alignment import aligned
from ..core.node import Node, node_of
from .loop_run import LoopRun, MemoryExchange
from .runner import OpError, describe, op_seed, run_nodes, run_op

__all__ = ["evaluate", "evaluate_persisted", "OpError", "describe", "op_seed", "run_nodes", "run_op"]


def evaluate(outputs: Any, graph_seed: Optional[int] = None, device: str = "cpu") -> Any:
    """Compute recorded ops in this process (no Redis, no compiler) on `device`: a reference for tests.

    Returns one tensor per op in `outputs` (a single tensor if `outputs` is one Op)."""
    single = not isinstance(outputs, (list, tuple))
    outputs = [outputs] if single else list(outputs)
    values = _evaluate(outputs[0].graph, outputs, (), graph_seed, device)
    return values[0] if single else values


def evaluate_persisted(graph: Any, names: Optional[Iterable[str]] = None,
                       graph_seed: Optional[int] = None) -> dict[str, torch.Tensor]:
    """{name: tensor} of the values persisted in `graph` (all, or `names`), the values loop steps persist
    included: what a worker would store, computed in this process."""
    names = list(graph.persisted) + list(graph.step_outputs) if names is None else list(names)
    unknown = [n for n in names if n not in graph.persisted and n not in graph.step_outputs]
    if unknown:
        raise KeyError(f"not persisted in graph {graph.name!r}: {unknown}")
    ops = [graph.persisted[n] for n in names if n in graph.persisted]
    wanted = {n for n in names if n in graph.step_outputs}
    # the loops that persist a value asked for, and those that send values to other loops (a resident pipeline
    # stage without parameters: nothing reads its results, yet the others wait for what it sends), as the compiler
    # keeps every loop; of a part recorded in several forms, the last form's (what later ops read:
    # ravop/record/forms.py)
    others = [range(form.start, form.stop) for part in graph.strategy_notes.forms for name, form in part.forms.items()
              if name != part.last]
    loops = [node_id for node_id, record in graph.loops.items()
             if not any(node_id in ids for ids in others) and (
                 any(n in wanted for per_template in record.names for per_output in per_template for n in per_output)
                 or any(template.sent for template in record.spec.templates))]
    found: dict[str, Any] = {}
    values = _evaluate(graph, ops, loops, graph_seed, step_values=found)
    result = dict(zip([n for n in names if n in graph.persisted], values))
    result.update((n, found[n]) for n in names if n in wanted)
    return result


def _evaluate(graph: Any, outputs: Sequence[Any], loops: Iterable[int], graph_seed: Optional[int],
              device: str = "cpu", step_values: Optional[dict[str, Any]] = None) -> list[Any]:
    seed = graph.seed if graph_seed is None else graph_seed
    roots = list(outputs) + [graph.nodes[i] for i in loops]
    needed: set[int] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node.id not in needed:
            needed.add(node.id)
            stack.extend(node.inputs)
    inputs = registry.INPUTS
    # constants as a worker reads them from the store: aligned (a slice of the user's array need not be)
    env = {i: aligned(graph.constants[i]).to(device) for i in needed if graph.nodes[i].op in inputs}
    rows = [node_of(graph.nodes[i]) for i in sorted(needed) if graph.nodes[i].op not in inputs]
    last_use = {i: index for index, row in enumerate(rows) for i in row.inputs}  # free values as a worker does
    for o in roots:
        last_use.pop(o.id, None)
    start = 0
    exchanging = _Exchanging()
    with torch.no_grad():
        for index, row in enumerate(rows + [None]):
            if row is not None and row.op not in registry.LOOPS:
                continue
            segment = exchanging.defer(rows[start:index], row is None, env, seed, device)
            run_nodes(segment, env, seed, device, [r.id for r in segment if last_use.get(r.id, index) >= index])
            if row is None:
                break
            record = graph.loops[row.id]

            def keep(done: int, template: int, run: int, values: list[Any], carried: list[Any],
                     record: Any = record) -> None:
                if step_values is not None:
                    for names, value in zip(record.names[template], values):
                        step_values[names[run]] = value
            loop = LoopRun(record.spec, [env[i] for i in row.inputs], seed, device)
            if loop.exchanges():   # resident replicas: run at once, each waits for what the others send
                exchanging.start(row.id, loop, keep)
            else:
                env[row.id] = tuple(loop.run(on_step=keep))
            start = index + 1
    return [env[o.id] for o in outputs]


class _Exchanging:
    """Loops that exchange values (resident replicas), each run by a thread, joined before their results are
    read."""

    def __init__(self) -> None:
        self.exchange = MemoryExchange()
        self.pending: dict[int, Any] = {}
        self.deferred: list[Node] = []   # projections of running loops
        self.lock = threading.Lock()   # keep() writes the shared step values

    def start(self, loop_id: int, loop: LoopRun, keep: Any) -> None:
        result: dict[str, Any] = {}

        def locked_keep(*args: Any) -> None:
            with self.lock:
                keep(*args)

        def target() -> None:
            with torch.no_grad():
                try:
                    result["carried"] = loop.run(on_step=locked_keep, exchange=self.exchange)
                except BaseException as exc:   # re-raised in the caller's thread by join
                    result["error"] = exc
                    self.exchange.fail(exc)
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self.pending[loop_id] = (thread, result)

    def defer(self, segment: list[Node], last: bool, env: dict[int, Any], seed: int, device: str) -> list[Node]:
        """The rows of `segment` to run now: the projections of running loops wait for them (the next replica's
        loop must start first); a row that reads a running loop's result, or the end, joins them."""
        if not self.pending:
            return segment
        waiting = set(self.pending) | {row.id for row in self.deferred}
        now = []
        for row in segment:
            if row.op in registry.PROJECTIONS and row.inputs[0] in self.pending:
                self.deferred.append(row)
                waiting.add(row.id)
            elif any(i in waiting for i in row.inputs):
                self.join(env, seed, device)
                waiting = set()
                now.append(row)
            else:
                now.append(row)
        if last:
            self.join(env, seed, device)
        return now

    def join(self, env: dict[int, Any], seed: int, device: str) -> None:
        errors = []
        for loop_id, (thread, result) in list(self.pending.items()):
            thread.join()
            del self.pending[loop_id]
            if "error" in result:
                errors.append(result["error"])
            else:
                env[loop_id] = tuple(result["carried"])
        if errors:   # the first loop's own error, not the others' "a loop failed"
            raise next((e for e in errors if not str(e).startswith("a loop this one")), errors[0])
        run_nodes(self.deferred, env, seed, device, [row.id for row in self.deferred])
        self.deferred = []
