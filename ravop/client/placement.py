"""Which worker held each replica of a strategy's fit, from the engine's own records (the `taken` and `ran` hashes:
the worker that last started and the one that finished each subgraph), not the forecast R.activate() prints.

At record time a fit under a strategy notes the loop ops of each replica (`Graph.strategy_notes.loops`: one resident
loop, or one segment per synchronisation interval; those of both forms where both are recorded); at activation
`replica_subgraphs` maps those the plan holds (the chosen form's) to its subgraph ids, kept in the graph's stored
summary; `held_by` reads who ran them, `contributions` what each replica contributed (both read in
ravop/store/contributions.py, which `ravop status` shares)."""
from typing import Any, Dict, List, Tuple, Union

from ..record.graph import Graph, current_graph
from ..store import GraphKeys
from ..store import contributions as store_contributions
from ..store.lookup import find_graph
from .session import require

Roles = Dict[str, Dict[str, List[int]]]   # strategy repr -> role ('replica r') -> ids


def replica_subgraphs(graph: Graph, plan: Any) -> Roles:
    """{strategy: {role: [subgraph ids]}} of `graph`'s fits under a strategy, in the compiled `plan`."""
    where = {node_id: subgraph.id for subgraph in plan.subgraphs if subgraph.HasField("loop")
             for node_id in subgraph.nodes.id}
    found: Roles = {}
    for strategy, loops in zip(graph.strategy_notes.fits, graph.strategy_notes.loops):
        roles = found.setdefault(repr(strategy), {})
        for role, node_ids in loops.items():
            roles.setdefault(role, []).extend(where[i] for i in node_ids if i in where)
    return found


def _keys(graph: Union[None, Graph, str]) -> Tuple[Any, GraphKeys]:
    session = require()
    graph = current_graph() if graph is None else graph
    return session.client, GraphKeys(session.token, graph.id) if isinstance(graph, Graph) else \
        find_graph(session.client, session.token, graph)


def held_by(graph: Union[None, Graph, str] = None) -> Dict[str, Dict[str, List[str]]]:
    """{strategy: {role: [workers]}}: the workers that ran each replica's loops, in order of first use (a resident
    replica's one worker, or each worker that held it in turn: its first, the one that took it over where it was
    lost; with segments, the workers of its intervals). A loop still running counts the worker running it; one
    not started yet names none (ravop.store.contributions)."""
    return store_contributions.held_by(*_keys(graph))


def contributions(graph: Union[None, Graph, str] = None) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """{strategy: {role ('replica r'): {"workers", "steps_per_round", "samples_per_round", "rounds", "steps_done",
    "samples_done", "rounds_without"}}}: who ran each replica of the graph's fits on shards over time (a takeover
    names a second worker), its steps and samples per round as recorded (DiLoCo's `round` makes them unequal),
    what it has done so far, and the rounds that closed without it (DiLoCo's `close_after`;
    ravop.store.contributions)."""
    return store_contributions.contributions(*_keys(graph))
