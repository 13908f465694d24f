"""Which worker held each replica of a strategy's fit, from the engine's own records (the `taken` and `ran` hashes:
the worker that last started and the one that finished each subgraph), not the forecast R.activate() prints.

At record time a fit under a strategy notes the loop ops of each replica (`Graph.parallel_loops`: one resident
loop, or one segment per synchronisation interval); at activation `replica_subgraphs` maps them to the plan's
subgraph ids, kept in the graph's stored summary; `held_by` reads who ran them, `contributions` what each
replica contributed per round."""
import json
from typing import Any, Dict, List, Union

from ..record.graph import Graph, current_graph
from ..store import GraphKeys
from ..store.lookup import find_graph
from .session import require

Roles = Dict[str, Dict[str, List[int]]]   # strategy repr -> role ('replica r') -> ids


def replica_subgraphs(graph: Graph, plan: Any) -> Roles:
    """{strategy: {role: [subgraph ids]}} of `graph`'s fits under a strategy, in the compiled `plan`."""
    where = {node_id: subgraph.id for subgraph in plan.subgraphs if subgraph.HasField("loop")
             for node_id in subgraph.nodes.id}
    found: Roles = {}
    for strategy, loops in zip(graph.parallel_fits, graph.parallel_loops):
        roles = found.setdefault(repr(strategy), {})
        for role, node_ids in loops.items():
            roles.setdefault(role, []).extend(where[i] for i in node_ids if i in where)
    return found


def held_by(graph: Union[None, Graph, str] = None) -> Dict[str, Dict[str, List[str]]]:
    """{strategy: {role: [workers]}}: the workers that ran each replica's loops, in order of first use (a resident
    replica's one worker, which is the one that took it over where its first was lost; with segments, the workers
    of its intervals). A loop still running counts the worker running it; one not started yet names none."""
    session = require()
    graph = current_graph() if graph is None else graph
    keys = GraphKeys(session.token, graph.id) if isinstance(graph, Graph) else \
        find_graph(session.client, session.token, graph)
    pipe = session.client.pipeline(transaction=False)
    pipe.hget(keys.meta, "summary")
    pipe.hgetall(keys.taken)
    pipe.hgetall(keys.ran)
    summary, taken, ran = pipe.execute()
    roles: Roles = json.loads(summary or b"{}").get("replica_subgraphs", {})
    taken = {int(k): v.decode() for k, v in taken.items()}
    ran = {int(k): v.decode() for k, v in ran.items()}
    held: Dict[str, Dict[str, List[str]]] = {}
    for strategy, by_role in roles.items():
        held[strategy] = {}
        for role, subgraphs in by_role.items():
            workers: List[str] = []
            for s in subgraphs:
                for worker in (ran.get(s), taken.get(s)):
                    if worker is not None and worker not in workers:
                        workers.append(worker)
            held[strategy][role] = workers
    return held


def contributions(graph: Union[None, Graph, str] = None) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """{strategy: {role ('replica r'): {"workers", "steps_per_round", "samples_per_round", "rounds",
    "rounds_without"}}}: who ran each replica of the graph's fits on shards (`held_by`), its steps and samples per
    round as recorded (DiLoCo's `round` makes them unequal), and the rounds that closed without it (DiLoCo's
    `close_after`: replica 0 records, per sync, which replicas it went without; worker/loops/exchange.py)."""
    session = require()
    graph = current_graph() if graph is None else graph
    keys = GraphKeys(session.token, graph.id) if isinstance(graph, Graph) else \
        find_graph(session.client, session.token, graph)
    rounds = json.loads(session.client.hget(keys.meta, "summary") or b"{}").get("replica_rounds", {})
    held = held_by(graph)
    found: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for strategy, by_role in rounds.items():
        n = max((r["rounds"] for r in by_role.values()), default=0)
        # replica 0's sync receives `present.1`, ... first: index i of a run's record is replica i + 1
        records = session.client.mget([keys.exchange("without.present.1", run) for run in range(n)]) \
            if len(by_role) > 1 and n else []
        without = [set(json.loads(record)) if record else set() for record in records]
        found[strategy] = {role: {**schedule, "workers": held.get(strategy, {}).get(role, []),
                                  "rounds_without": [run for run, missing in enumerate(without)
                                                     if int(role.split()[-1]) - 1 in missing]}
                           for role, schedule in by_role.items()}
    return found
