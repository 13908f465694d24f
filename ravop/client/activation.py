"""R.activate: compile the current graph (or check a federated one) and upload it, by its kind
(`ravop.client.graph_kinds`); no ops may be added to it afterwards."""
from typing import Any

from ..core.persist_rules import PersistedIds
from ..core import heap
from ..record.graph import current_graph
from .graph_kinds import kind_of
from .session import require


def activate(**compile_options: Any) -> dict:
    """Compile the current graph and upload it; no ops may be added to it afterwards. Returns a `Summary`
    (ops, subgraphs, estimated FLOPs, max parallel width). `compile_options` go to `compiler.compile_graph`
    (e.g. max_subgraph_seconds)."""
    session = require()
    graph = current_graph()
    graph.check_open()
    if session.embedded is not None:
        session.embedded.check_runs(graph)
    summary, names = kind_of(graph.approach).activate(session, graph, compile_options)
    heap.trim()   # what compiling and packing the plan allocated, freed now (resnet18's fit: 17 MiB)
    graph.activated = True
    session.graph_id = graph.id
    session.activated_names = names if isinstance(names, PersistedIds) else PersistedIds(names, [])
    return summary
