"""compile_graph: recorded graph -> IR -> passes -> fused chains, cost model -> partition -> protobuf plan."""
import gc
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

from . import cost, ir as ir_module
from .partition import coarse_graph, max_parallel_width, partition
from .pass_manager import PIPELINE, UNFOLDED_PIPELINE, Passes, run_pipeline, strategy_pipeline, strategy_point
from .passes import fuse_linear_chains
from .passes.strategy import FoldedLoop, folded_loops as replicated_loops
from .plan import emit_plan

if TYPE_CHECKING:
    from ravop.record.graph import Graph

MIN_SUBGRAPH_SECONDS = 0.004  # ~20x a Redis round trip (0.1-0.3 ms), so a hop costs at most ~5%
MAX_SUBGRAPH_SECONDS = 1.0    # bounded runs: a long loop reports progress and is retried in pieces of ~1 s


class CompiledGraph:
    """`plan`: the `ravop.wire.plan_pb2.Plan`; `constants`: node id -> tensor the requester uploads (graph
    constants still read, and values made by constant folding); `summary`: counts for the user."""
    __slots__ = ("plan", "constants", "summary")

    def __init__(self, plan: Any, constants: dict[int, Any], summary: dict[str, Any]) -> None:
        self.plan, self.constants, self.summary = plan, constants, summary

    def __repr__(self) -> str:
        return f"<CompiledGraph {self.summary}>"


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Compiling allocates a few objects per op, none in reference cycles; the cyclic collector would
    still walk the whole heap (the recorded graph included) several times over, 10-20% of the compile."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def handoff_seconds(plan: Any, costs: cost.Costs) -> float:
    """The estimated time of moving every subgraph output through the store once (a parallel fit's
    synchronisations are most of it, so `sync_every` shows here); loop-persisted values are left out."""
    recorded = len(costs.out_bytes)
    moved = sum(costs.out_bytes[i] for sub in plan.subgraphs for i in sub.outputs if i < recorded)
    return moved / costs.handoff_bytes_per_s


def _passes(graph: "Graph") -> Passes:
    return PIPELINE if graph.verify == 1 and not graph.strategy_notes.fits else UNFOLDED_PIPELINE


def _hand_written_under_strategy(graph: "Graph") -> bool:
    return graph.strategy is not None and not graph.strategy_notes.fits


def folded_loops(graph: "Graph") -> list[FoldedLoop]:
    """What the client records the replicas of `graph`'s hand-written loops from, when its strategy is theirs (no
    fit used it): the loops the passes fold, each a `FoldedLoop` ([] for any other graph). The compiler records
    nothing; `ravop.parallel.hand_written.record_replica_loops` does, and `compile_graph(..., replicas=)` splices."""
    if not _hand_written_under_strategy(graph):
        return []
    passes = _passes(graph)
    with _cyclic_gc_paused():
        ir, _ = run_pipeline(ir_module.from_graph(graph), passes[:strategy_point(passes)])
    return replicated_loops(ir, graph.strategy, set(graph.loops))


def compile_graph(graph: "Graph", min_subgraph_seconds: float = MIN_SUBGRAPH_SECONDS,
                  max_subgraph_seconds: float = MAX_SUBGRAPH_SECONDS,
                  devices: dict[str, cost.DeviceModel] = cost.DEVICES,
                  replicas: Optional[Sequence[Any]] = None, forms: Optional[Sequence[str]] = None) -> CompiledGraph:
    """Compile a recorded `ravop.record.graph.Graph` (which is not modified; nothing is recorded) into a plan of
    subgraphs. `devices`: the cost model's figures per device kind (`compiler.cost.calibrated` makes them from the
    workers' own). `replicas`: for a graph whose strategy is its hand-written loops', the replicas recorded for
    each of `folded_loops(graph)` (`ravop.client.graph_kinds.compile_planned` records them and compiles). `forms`:
    the form that runs of each part the graph records in several (`graph.strategy_notes.forms`: a fit's resident
    replicas or segments, ravop/record/forms.py), which the session chooses at activation; None: the last recorded
    of each."""
    if not 0 <= min_subgraph_seconds <= max_subgraph_seconds:
        raise ValueError(f"need 0 <= min_subgraph_seconds <= max_subgraph_seconds, got "
                         f"{min_subgraph_seconds} and {max_subgraph_seconds}")
    if _hand_written_under_strategy(graph) and replicas is None:
        raise TypeError(f"graph {graph.name!r} has strategy={graph.strategy!r} over hand-written loops: give "
                        "the replicas recorded from compiler.folded_loops(graph) as replicas= (R.activate() does: "
                        "ravop.client.graph_kinds.compile_planned)")
    if replicas is not None and not _hand_written_under_strategy(graph):
        raise ValueError(f"replicas= applies to a graph whose strategy is its hand-written loops', not to graph "
                         f"{graph.name!r}")
    with _cyclic_gc_paused():
        passes = _passes(graph)
        if replicas is not None:   # a hand-written loop under a strategy
            passes = strategy_pipeline(passes, graph.strategy, set(graph.loops), replicas)
        ir, counts = run_pipeline(ir_module.from_graph(graph, forms), passes)
        chained, counts["fused_chains"] = fuse_linear_chains(ir)
        costs = cost.estimate(ir, devices)
        windows = partition(ir, costs, chained, min_subgraph_seconds, max_subgraph_seconds)
        plan = emit_plan(ir, windows, costs)
    quotient = coarse_graph(windows, [(sub.id, s) for sub in plan.subgraphs for s in sub.successors])
    plan.max_parallel_width = max_parallel_width(quotient)
    # recorded_ops: the user's; replicas of a hand-written loop add ids to the plan's n_recorded_ops
    summary = {"recorded_ops": len(graph.nodes), "compiled_ops": plan.n_compiled_ops,
               "subgraphs": len(windows), "flops": plan.flops, "max_parallel_width": plan.max_parallel_width,
               "estimated_seconds": sum(costs.seconds), "constants": len(ir.constants), "loop_steps": plan.n_steps,
               "estimated_handoff_seconds": handoff_seconds(plan, costs),
               **counts}
    return CompiledGraph(plan, ir.constants, summary)
