"""A quick run of the worker fuzzer (benchmarks/fuzz_worker.py has the long one): a few hundred seeded-random
hostile messages, plans and tensors; every one is dead-lettered with a reason (or runs, where a mutation left
a valid plan), the workers stay up within their memory budget, and a valid graph afterwards gives the exact
result."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from fuzz_worker import MESSAGE_KINDS, MODEL_KINDS, PLAN_KINDS, RAW, run_fuzz  # noqa: E402

from helpers import assert_a_valid_graph_runs  # noqa: E402


def test_hostile_input_is_dead_lettered_and_the_workers_go_on(engine, workers, client):
    names = workers.start(2, extra=["--max-memory-bytes", str(1 << 30)])
    report = run_fuzz(client, 400, seed=14, stall_seconds=60)
    print(report.table())
    assert report.problems == []
    assert set(report.cases) == set(PLAN_KINDS) | set(MESSAGE_KINDS)   # every kind was tried
    reasons = {reason for (_, reason) in report.outcomes}
    assert {"rejected plan", "malformed message", "forged message", "no such graph", "missing input",
            "bad input"} <= reasons
    assert sum(n for (kind, _), n in report.outcomes.items() if kind == RAW) == \
        sum(report.cases[kind] for kind in MESSAGE_KINDS)
    assert all(workers.alive(name) for name in names)
    assert 0 < report.peak_rss < 1 << 30   # what the workers advertised while at it: within their budget
    assert_a_valid_graph_runs()


def test_hostile_model_archives_fail_their_graphs_and_the_workers_go_on(engine, workers, client):
    """TorchScript archives (issue 44): code nested past the bound or deep enough to crash torch's parser (in the
    sandbox), zip bombs, 70,000 entries, size lies, duplicate, `..`, absolute and backslash names, truncated
    and random archives, unsafe code; each fails its graph with a reason, the valid ones run."""
    names = workers.start(2, extra=["--max-memory-bytes", str(1 << 30)])
    report = run_fuzz(client, 60, seed=44, stall_seconds=120, kinds=MODEL_KINDS)
    print(report.table())
    assert report.problems == []
    assert set(report.cases) == set(MODEL_KINDS)
    ran = {kind for (kind, reason) in report.outcomes if reason.startswith("ran")}
    assert ran == {"model: valid model"}
    assert all(workers.alive(name) for name in names)
    assert_a_valid_graph_runs()
