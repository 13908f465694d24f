"""The partitioner: cut the op DAG into subgraphs that form an acyclic quotient graph.

1. Order: a depth-first post-order from the persisted outputs (inputs before readers), so each branch is
   a contiguous run; a multi-output node is followed at once by its tuple_get readers.
2. Windows: walk that order, closing the current window before op v when
   - the window plus v would run longer than `max_seconds` (a long training loop becomes bounded runs,
     so persisted losses appear while it trains), though never between a multi-output node and its
     tuple_gets; or
   - v does not continue a fused chain from the previous op (a branch starts, joins or forks there) and
     either the window already carries enough work to dwarf the hand-off (see below), or v's own chain
     carries `min_seconds` and more than the hand-off costs (a heavy branch gets its own subgraph, so
     another worker can run it meanwhile).

The hand-off of a cut is a queue hop plus the values the window makes that later ops read: its worker
encodes and stores them, the next one fetches and decodes them. In a training loop those are every
parameter and optimizer moment, megabytes at each cut, so a window closes only when its work is at least
`min_seconds` and at least 1/HANDOFF_SHARE times the estimated transfer of its live-out bytes, unless v
reads a window this one does not wait for yet (a join of two branches: then `min_seconds` is enough, and
the cut keeps the branches parallel).

Acyclicity: the order is topological, so every edge runs from an op to a later op, hence from a window to
the same or a later window. Every edge of the quotient graph therefore goes from a lower window index to a
higher one, and no cycle can exist. (`coarse_graph` checks it anyway.)

A loop op (with its tuple_get readers) is always a window of its own: a worker runs it as one loop, keeping
its carried values in memory (`worker.loops.loop_subgraph`). The fills it reads (ops that read nothing, such as
the zeros an optimizer's moments start from, too big for constant folding) and nothing else reads go into its
window, ahead of it (`loop_fills`): made where they are used, they cost no subgraph of their own, no queue hop
and no upload. A fill that several loops read is made in each of their windows.

All ops of a graph share one device (`ir.device`, from the graph's `gpu_required`), so no window mixes
devices.
"""
from typing import Any, Collection, Iterable, Sequence

import networkx as nx

from ravop.core.registry import INPUTS, LOOPS, NOT_KERNELS, PROJECTIONS

from .cost import Costs
from .ir import IR
from .pass_manager import InvariantError

HANDOFF_SHARE = 0.2         # a cut's transfer may cost at most this share of the window's estimated work


def loop_fills(ir: IR) -> dict[int, list[int]]:
    """{loop id: [fill ids]}: the ops that read nothing (zeros, arange, a random draw) that only loop
    ops read, not persisted, per loop reading them. Such an op computes the same value wherever it runs (a
    random one draws from the graph seed and its own id), so each loop's worker makes it itself."""
    nodes = ir.nodes
    readers: dict[int, set[int]] = {id: set() for id, node in nodes.items() if not node.inputs and node.op not in NOT_KERNELS}
    if not readers:
        return {}
    for id, node in nodes.items():
        for i in node.inputs:
            if i in readers:
                readers[i].add(id)
    persisted = set(ir.outputs.values())
    fills: dict[int, list[int]] = {}
    for id, read_by in readers.items():
        if read_by and id not in persisted and all(nodes[r].op in LOOPS for r in read_by):
            for r in read_by:
                fills.setdefault(r, []).append(id)
    return fills


def dfs_order(ir: IR, skip: Collection[int] = ()) -> list[int]:
    """Non-constant live node ids but `skip`'s, inputs before readers, each branch contiguous."""
    nodes = ir.nodes
    outputs_of: dict[int, list[int]] = {}  # multi-output node id -> its tuple_get readers, emitted right after it
    for id, node in nodes.items():
        if node.op in PROJECTIONS:
            outputs_of.setdefault(node.inputs[0], []).append(id)
    state = dict.fromkeys(nodes, 0)  # 0 new, 1 inputs being visited, 2 emitted
    for id, node in nodes.items():
        if node.op in INPUTS:
            state[id] = 2
    for id in skip:
        state[id] = 2
    order: list[int] = []
    emit = order.append
    for root in ir.roots():
        if state[root]:
            continue
        stack = [root]
        while stack:
            v = stack[-1]
            s = state[v]
            if s == 0:
                state[v] = 1
                inputs = nodes[v].inputs
                for k in range(len(inputs) - 1, -1, -1):  # first input on top: visited first
                    if state[inputs[k]] == 0:
                        stack.append(inputs[k])
                continue
            stack.pop()
            if s == 1:
                state[v] = 2
                emit(v)
                for t in outputs_of.get(v, ()):
                    state[t] = 2
                    emit(t)
    return order


def chain_costs(ir: IR, chained: dict[int, int], seconds: Sequence[float]) -> dict[int, float]:
    """id -> seconds of the fused chain from that node to the chain's end."""
    after = {u: v for v, u in chained.items()}
    total: dict[int, float] = {}
    for id in reversed(ir.nodes):
        nxt = after.get(id)
        total[id] = seconds[id] + (total[nxt] if nxt is not None else 0.0)
    return total


def partition(ir: IR, costs: Costs, chained: dict[int, int], min_seconds: float,
              max_seconds: float) -> list[list[int]]:
    """Windows of the DFS order: a list of lists of node ids, each list in topological order. `chained` maps
    each node that continues a fused linear chain to its predecessor (`compiler.passes.fuse_linear_chains`)."""
    fills = loop_fills(ir)
    order = dfs_order(ir, {id for ids in fills.values() for id in ids})   # placed with their loops below
    seconds, out_bytes = costs.seconds, costs.out_bytes
    chain = chain_costs(ir, chained, seconds)
    nodes = ir.nodes
    last_read = _last_reads(ir, order)
    window_of = [-1] * ir.n_recorded   # -1: a constant, or not placed yet
    ancestors: list[int] = []   # per closed window: bitmask of the windows it waits for, directly or not
    windows: list[list[int]] = []
    current: list[int]
    current, load, live, waits, prev = [], 0.0, 0, 0, -1   # live: bytes of the window's values read after it
    for t, v in enumerate(order):
        c = seconds[v]
        node = nodes[v]
        inputs = node.inputs
        window = len(windows)
        if current and node.op not in PROJECTIONS:
            linked = chained.get(v) == prev
            # v reads a window this one does not wait for yet: keeping v out lets the two run side by side.
            joins = False
            for i in inputs:
                u = window_of[i]
                if 0 <= u < window and not waits >> u & 1:
                    joins = True
                    break
            handoff = live / costs.handoff_bytes_per_s
            enough = load >= min_seconds and (joins or load * HANDOFF_SHARE >= handoff)
            heavy = chain[v] >= min_seconds and chain[v] >= handoff   # a branch run apart must win back the cut
            alone = node.op in LOOPS or nodes[current[0]].op in LOOPS   # a loop is a subgraph of its own
            if alone or load + c > max_seconds or (not linked and (enough or heavy)):
                windows.append(current)
                ancestors.append(waits)
                current, load, live, waits = [], 0.0, 0, 0
                window += 1
        for i in inputs:
            u = window_of[i]
            if u < 0:
                continue
            if u != window:
                waits |= (1 << u) | ancestors[u]
            elif last_read[i] == t:
                live -= out_bytes[i]
                last_read[i] = -1   # read twice by v (x @ x): counted once
        if last_read[v] > t:
            live += out_bytes[v]
        window_of[v] = window
        current.append(v)
        load += c
        prev = v
    if current:
        windows.append(current)
    if fills:
        windows = [[*fills.get(window[0], ()), *window] for window in windows]
    return windows


def _last_reads(ir: IR, order: Sequence[int]) -> list[int]:
    """Node id -> position in `order` of its last reader (-1: none); persisted outputs are read after the end."""
    last = [-1] * ir.n_recorded
    nodes = ir.nodes
    for t, v in enumerate(order):
        for i in nodes[v].inputs:
            last[i] = t
    end = len(order)
    for v in ir.outputs.values():
        last[v] = end
    return last


def coarse_graph(windows: Sequence[Sequence[int]], edges: Iterable[tuple[int, int]]) -> Any:
    """The quotient graph as a networkx DiGraph over window indices; `InvariantError` if it is cyclic."""
    g = nx.DiGraph()
    g.add_nodes_from(range(len(windows)))
    g.add_edges_from(edges)
    if not nx.is_directed_acyclic_graph(g):
        raise InvariantError("the partitioner made subgraphs that depend on each other in a cycle")
    return g


def max_parallel_width(g: Any) -> int:
    """The widest level of the quotient DAG (level = longest path from a source): how many subgraphs can be
    ready at once when each level waits for the one before. Linear time."""
    return max((len(level) for level in nx.topological_generations(g)), default=0)
