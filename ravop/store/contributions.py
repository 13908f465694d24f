"""Who ran each replica of a graph's fits under a strategy, and what it contributed, from the engine's own records:
the workers that claimed its loop subgraphs (`held`, in order: a takeover or a provider that joined and took a
waiting replica shows as a further worker), the steps its loops recorded so far (`steps`, over each loop's
planned steps in the summary's `loop_steps`), and the rounds that
closed without it (DiLoCo's `close_after`: replica 0 records, per sync, which replicas it went without;
worker/loops/exchange.py). The subgraphs of each replica and its schedule per round are in the graph's stored
summary (ravop/client/graph_kinds.py, from the recorded fit). The session's `history` and `ravop status` read
them here, with no torch and no session."""
import json
from typing import Any, Dict, List

from .client_types import Client
from .keys import GraphKeys

Held = Dict[str, Dict[str, List[str]]]   # strategy repr -> role ('replica r') -> workers


def _read(client: Client, keys: GraphKeys) -> tuple:
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.meta, "summary")
    pipe.hgetall(keys.held)
    pipe.hgetall(keys.steps)
    summary, held, steps = pipe.execute()
    held = {int(k): v.decode().split(",") for k, v in held.items()}
    return json.loads(summary or b"{}"), held, {int(k): int(v) for k, v in steps.items()}


def _over_time(subgraphs: List[int], held: Dict[int, List[str]]) -> List[str]:
    """The workers of a role's subgraphs in order, a worker named again only after another."""
    workers: List[str] = []
    for s in subgraphs:
        for worker in held.get(s, []):
            if not workers or workers[-1] != worker:
                workers.append(worker)
    return workers


def held_by(client: Client, keys: GraphKeys) -> Held:
    """{strategy: {role: [workers]}}: the workers that ran each replica's loops, in order of first use (a loop
    still running counts the worker running it; one not started yet names none)."""
    summary, held, _ = _read(client, keys)
    return {strategy: {role: list(dict.fromkeys(_over_time(subgraphs, held))) for role, subgraphs in roles.items()}
            for strategy, roles in summary.get("replica_subgraphs", {}).items()}


def contributions(client: Client, keys: GraphKeys) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """{strategy: {role: {"workers", "steps_per_round", "samples_per_round", "rounds", "steps", "steps_done",
    "samples_done", "rounds_without"}}}: `workers` over time (['a', 'b'] when b took the replica over from a),
    the schedule as recorded (DiLoCo's `round` makes it unequal; `steps` in all), the inner steps done so far
    (from what its loops recorded as they checkpoint and flush losses, so a running loop's count lags by up to a
    flush) and their samples at full batches, and the rounds that closed without it."""
    summary, held, steps = _read(client, keys)
    subgraphs, loop_steps = summary.get("replica_subgraphs", {}), summary.get("loop_steps", {})
    found: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for strategy, by_role in summary.get("replica_rounds", {}).items():
        n = max((r["rounds"] for r in by_role.values()), default=0)
        # replica 0's sync receives `present.1`, ... first: index i of a run's record is replica i + 1
        records = client.mget([keys.exchange("without.present.1", run) for run in range(n)]) \
            if len(by_role) > 1 and n else []
        without = [set(json.loads(record)) if record else set() for record in records]
        found[strategy] = {}
        for role, schedule in by_role.items():
            mine = subgraphs.get(strategy, {}).get(role, [])
            # a loop's recorded steps count its sync templates' runs too: its inner steps in proportion
            planned = sum(loop_steps.get(str(s), 0) for s in mine)
            done = schedule["steps"] * sum(steps.get(s, 0) for s in mine) // planned if planned else 0
            found[strategy][role] = {
                **schedule, "workers": _over_time(mine, held), "steps_done": done,
                "samples_done": done * schedule["samples_per_round"] // schedule["steps_per_round"],
                "rounds_without": [run for run, missing in enumerate(without) if int(role.split()[-1]) - 1 in missing]}
    return found
