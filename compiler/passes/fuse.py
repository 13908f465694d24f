"""Fusion of linear chains (dask's `fuse_linear`): mark each link u -> v where v is u's only reader and u
is v's only computed input. The partitioner never cuts a link (unless a run would exceed its time
bound), so a chain of single-reader ops runs as one piece on one worker with its intermediates never
leaving it. It runs once, after the passes, and hands its map to the partitioner: the IR does not change."""
from ravop.core.registry import INPUTS

from ..ir import IR


def fuse_linear_chains(ir: IR) -> tuple[dict[int, int], int]:
    """Returns ({v: u for every link u -> v}, number of chains of two or more nodes)."""
    nodes = ir.nodes
    readers = dict.fromkeys(nodes, 0)
    for node in nodes.values():
        for i in node.inputs:
            readers[i] += 1
    chained: dict[int, int] = {}
    for id, node in nodes.items():
        computed = None
        for i in node.inputs:
            if nodes[i].op not in INPUTS:
                if computed is not None:
                    break
                computed = i
        else:
            if computed is not None and readers[computed] == 1:
                chained[id] = computed
    chains = sum(1 for u in chained.values() if u not in chained)
    return chained, chains
