"""compile_graph: recorded graph -> IR -> passes -> fused chains, cost model -> partition -> protobuf plan."""
import gc
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from . import cost, ir as ir_module
from .partition import coarse_graph, max_parallel_width, partition
from .pass_manager import PIPELINE, UNFOLDED_PIPELINE, run_pipeline, strategy_pipeline
from .passes import fuse_linear_chains
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


def compile_graph(graph: "Graph", min_subgraph_seconds: float = MIN_SUBGRAPH_SECONDS,
                  max_subgraph_seconds: float = MAX_SUBGRAPH_SECONDS,
                  devices: dict[str, cost.DeviceModel] = cost.DEVICES) -> CompiledGraph:
    """Compile a recorded `ravop.record.graph.Graph` (which is not modified) into a plan of subgraphs. `devices`: the
    cost model's figures per device kind (`compiler.cost.calibrated` makes them from the workers' own)."""
    if not 0 <= min_subgraph_seconds <= max_subgraph_seconds:
        raise ValueError(f"need 0 <= min_subgraph_seconds <= max_subgraph_seconds, got "
                         f"{min_subgraph_seconds} and {max_subgraph_seconds}")
    with _cyclic_gc_paused():
        passes = PIPELINE if graph.verify == 1 and not graph.parallel_fits else UNFOLDED_PIPELINE
        if graph.strategy is not None and not graph.parallel_fits:   # a hand-written loop under a strategy
            passes = strategy_pipeline(passes, graph.strategy, set(graph.loops))
        ir, counts = run_pipeline(ir_module.from_graph(graph), passes)
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
