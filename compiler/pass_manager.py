"""Run the passes in order and check the IR's invariants after each, as torch.fx's PassManager does: a pass
that breaks the IR is named at once instead of surfacing as a wrong result on a worker."""
from typing import Any, Callable, Collection, Optional, Sequence

from ravop.core.errors import RavopError
from ravop.core.loop_template import StepTemplate
from ravop.core.registry import INPUTS, PROJECTIONS

from .passes import eliminate_common_subexpressions, eliminate_dead_code, fold_constants, fold_repeated_steps
from .ir import IR
from .passes.strategy import replicate_folded_loops

# A pass: IR -> (the IR, or the same object when it changed nothing; a count for the summary).
Pass = Callable[[IR], tuple[IR, int]]
Passes = tuple[tuple[str, Pass], ...]

# (summary key, pass). Repeated steps fold after CSE, which content-addresses each step's constants, and before
# constant folding, which would turn the first step's ops on constants into constants. Folding leaves the
# inputs of what it folded unread, so dead code is culled again.
# Fusion is not a pass: it marks chains for the partitioner and changes nothing (compiler/compile.py).
PIPELINE: Passes = (
    ("dead_code_removed", eliminate_dead_code),
    ("cse_merged", eliminate_common_subexpressions),
    ("steps_folded", fold_repeated_steps),
    ("folded", fold_constants),
    ("dead_code_removed", eliminate_dead_code),
)
# For a graph that runs each subgraph on several workers to compare them (R.Graph(verify=k)): a folded loop
# would run as a whole on one, so its repeated steps stay unrolled.
UNFOLDED_PIPELINE: Passes = tuple(entry for entry in PIPELINE if entry[1] is not fold_repeated_steps)


def strategy_point(passes: Passes) -> int:
    """Where the strategy's pass goes in `passes`: right after folding (before constant folding where nothing
    folds, UNFOLDED_PIPELINE's, which it then refuses)."""
    runs = [run for _, run in passes]
    return runs.index(fold_repeated_steps) + 1 if fold_repeated_steps in runs else runs.index(fold_constants)


def strategy_pipeline(passes: Passes, strategy: object, recorded_loops: Collection[int],
                      replicas: Sequence[Any]) -> Passes:
    """`passes` for a graph whose `strategy` no fit used: the loops folded from its hand-written steps become the
    strategy's `replicas` (recorded by the client from `compiler.folded_loops`) right after folding
    (compiler/passes/strategy.py)."""
    at = strategy_point(passes)
    return passes[:at] + (("loops_replicated", replicate_folded_loops(strategy, recorded_loops, replicas)),) + \
        passes[at:]


class InvariantError(RavopError, RuntimeError):
    """A compiler pass produced an invalid IR (a bug in the compiler, not in the user's program)."""


def check_invariants(ir: IR, checked: Optional[IR] = None) -> None:
    """Raise `ValueError` describing the first broken invariant: ids ascending with every input defined
    earlier (a topological order, hence acyclic), every const node holding a value, every tuple_get reading
    a multi-output node, every persisted output kept and not multi-output, and in every loop template each
    value read or named defined before. `checked`: an IR checked already, whose loop records (the same objects)
    need no second look: a pass that changes a loop makes a new record."""
    nodes = ir.nodes
    previous = -1
    for id, node in nodes.items():
        if id <= previous:
            raise ValueError(f"node {id} comes after node {previous}: ids must ascend (topological order)")
        previous = id
        for i in node.inputs:
            if i >= id or i not in nodes:
                raise ValueError(f"node {id} ({node.op}) reads node {i}, which is not defined before it")
        if node.op in INPUTS:
            if id not in ir.constants:
                raise ValueError(f"const node {id} has no value")
        elif node.op in PROJECTIONS and not nodes[node.inputs[0]].multi_output:
            raise ValueError(f"tuple_get node {id} reads node {node.inputs[0]}, which has a single output")
    for name, id in ir.outputs.items():
        if id not in nodes:
            raise ValueError(f"persisted output {name!r} (node {id}) was removed")
        if nodes[id].multi_output:
            raise ValueError(f"persisted output {name!r} (node {id}) is a multi-output node")
    for id, record in ir.loops.items():
        if checked is not None and checked.loops.get(id) is record:
            continue
        for t, template in enumerate(record.spec.templates):
            _check_template(template, record.spec.outer_ids, f"loop {id}, step {t}")


def _check_template(template: StepTemplate, outer_ids: list[int], where: str) -> None:
    """Every op of a loop template reads its holes, the loop's inputs or an op before it, and its results and
    per-op lists name its ops."""
    defined = set(outer_ids) | set(template.hole_ids())
    for node in template.nodes:
        for i in node.inputs:
            if i not in defined:
                raise ValueError(f"{where}: node {node.id} ({node.op}) reads {i}, which is not defined before it")
        defined.add(node.id)
    named = {"carried values after the step": [c.after for c in template.carried],
             "outputs": [o.node for o in template.outputs], "sent values": [s.node for s in template.sent],
             "counter_nodes": template.counter_nodes, "seeded ops": [s.node for s in template.seeded],
             "seed followers": [f.node for f in template.seed_followers],
             "followed seeds' sources": [f.source for f in template.seed_followers]}
    for name, ids in named.items():
        missing = [i for i in ids if i not in defined]
        if missing:
            raise ValueError(f"{where}: its {name} {missing[:5]} are not defined")


def run_pipeline(ir: IR, passes: Passes = PIPELINE) -> tuple[IR, dict[str, int]]:
    """Apply `passes` in order; returns (ir, {summary key: total count}). Raises `InvariantError` naming the
    pass after which the IR became invalid."""
    try:
        check_invariants(ir)
    except ValueError as exc:
        raise InvariantError(f"the recorded graph is not a valid IR: {exc}") from None
    counts: dict[str, int] = {}
    for key, run in passes:
        before = ir
        ir, count = run(ir)
        if ir is before:
            counts.setdefault(key, 0)
            continue   # the pass changed nothing, so the IR is as valid as it was
        try:
            check_invariants(ir, checked=before)
        except ValueError as exc:
            raise InvariantError(f"compiler pass {run.__name__} broke an invariant: {exc}") from None
        counts[key] = counts.get(key, 0) + count
    return ir, counts
