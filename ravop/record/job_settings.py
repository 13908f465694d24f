"""A graph's job settings: what `R.Graph(...)` was given (its name, kind, device, seed, verification and
strategy), checked once and kept apart from the recorded op table (`ravop.record.graph.Graph.settings`). They are
the script's own: nothing here depends on the cluster a session later activates the graph on."""
from dataclasses import dataclass
from typing import Any, Optional

from ..core.spot_policy import Verify, parse_verify
from ..federated.column_rules import parse_rules
from ..parallel import check_strategy

APPROACHES = ("distributed", "federated")


@dataclass(frozen=True)
class JobSettings:
    name: str
    algorithm: str
    approach: str         # "distributed" (a plan the workers run) or "federated"
    gpu_required: bool
    rules: Any            # ravop.federated.column_rules.Rules of a federated graph, else None
    seed: int
    verify: int           # run each subgraph on this many distinct workers and compare their outputs
    spot: Optional[Verify]   # adaptive spot checks instead (verify='spot'), or None
    strategy: Any         # ravop.parallel strategy of its fits, or of its hand-written loops without one


def job_settings(name: str = "graph", algorithm: str = "", approach: str = "distributed", gpu_required: Any = "no",
                 rules: Any = None, seed: int = 0, verify: Any = 1, strategy: Any = None) -> JobSettings:
    """The checked settings of `R.Graph(...)`'s arguments; a clear error for any that does not apply."""
    if approach not in APPROACHES:
        raise ValueError(f"approach must be 'distributed' or 'federated', not {approach!r}")
    if gpu_required not in ("yes", "no", True, False):
        raise ValueError(f"gpu_required must be 'yes' or 'no', not {gpu_required!r}")
    if approach == "federated":
        if rules is None:
            raise ValueError("a federated graph needs rules, e.g. rules=json.dumps({\"rules\": {\"age\": "
                             "{\"min\": 18, \"max\": 80}}, \"max_clients\": 1})")
        if gpu_required in ("yes", True):
            raise ValueError("gpu_required='yes' does not apply to a federated graph: its statistics are "
                             "computed by the providers that hold the data")
        rules = parse_rules(rules)
    elif rules is not None:
        raise ValueError("rules apply only to approach='federated' graphs")
    copies, spot = parse_verify(verify)
    if (copies > 1 or spot is not None) and approach == "federated":
        raise ValueError("verify= does not apply to a federated graph: each provider's data is its own")
    if strategy is not None:
        check_strategy(strategy)
        if approach == "federated":
            raise ValueError("strategy= does not apply to a federated graph: each provider's data is its own")
    return JobSettings(name, algorithm, approach, gpu_required in ("yes", True), rules, int(seed), copies, spot,
                       strategy)
