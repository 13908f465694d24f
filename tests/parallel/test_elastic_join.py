"""Providers joining a running fit, as a user sees it (issue 43): a resident DiLoCo fit started with fewer workers
than replicas runs its replicas in turns (worker/loops/hand_back.py); a worker started a few rounds in claims a
waiting replica and contributes, `history.contributions` and `ravop status` name it, and the schedule being
fixed at record time, the bits are those of the undisturbed fit. A takeover names a second worker for the replica
(tests/parallel/test_resident_replicas.py)."""
import time
import uuid

import ravop as R
from ravop.client.placement import contributions
from ravop.core.graph_states import RUNNING
from ravop.store import GraphKeys, Scripts
from ravop.store.scripts import CLAIM_REPLIES, HELD_CHARS
from ravop.tools import status
from ravop.tools.cluster_cli import _status_text
from test_diloco_islands import fit_graph


def wait_for(found, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not (seen := found()):
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)
    return seen


def test_a_worker_that_starts_mid_fit_claims_a_waiting_replica_and_the_bits_are_undisturbed(engine, workers, client):
    first = workers.start(2, extra=["--emulate-device-flops", "1e5"])
    strategy = R.parallel.DiLoCo(3, 3, resident=True)
    graph, names = fit_graph("late joiner", strategy, n_epochs=24)   # 4 steps an epoch, 3 a round: 32 rounds
    R.execute()
    # a few rounds in (the replicas taking turns on two workers), a provider joins
    wait_for(lambda: max(seen["steps_done"] for seen in contributions(graph)[repr(strategy)].values()) >= 6,
             "two rounds done")
    late, = workers.start(1, prefix="late", extra=["--emulate-device-flops", "1e5"])
    rows = wait_for(lambda: [row for row in status.cluster(client, engine.token)["replicas"]
                             if row["graph"] == graph.id and late in row["workers"]], "status row naming the joiner")
    assert rows[0]["strategy"] == repr(strategy) and rows[0]["rounds"] == 32
    text = _status_text(status.cluster(client, engine.token), "redis://x")
    assert "replicas of running fits" in text and late in text
    R.track_progress(timeout=300, progress_bar=False)
    seen = contributions(graph)[repr(strategy)]
    assert {w for role in seen.values() for w in role["workers"]} <= set(first) | {late}
    joined = [role for role in seen.values() if late in role["workers"]]
    assert joined and all(role["steps_done"] == role["steps"] == 96 and role["samples_done"] == 96 * 4 for role in seen.values())
    got = {name: R.fetch_persisting_op(name) for name in names}
    fit_graph("undisturbed", strategy, n_epochs=24)
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    assert all(R.fetch_persisting_op(name).equal(got[name]) for name in names)
    assert not status.replicas(client, engine.token, status.graphs(client, engine.token))   # none running now


def test_with_close_after_the_rounds_before_a_joiner_go_without_the_replicas_not_held(engine, workers):
    # two workers for three replicas, each round closed after 0.3 s: replica 0 does not wait for the one queued
    first = workers.start(2, extra=["--emulate-device-flops", "1e5"])
    strategy = R.parallel.DiLoCo(3, 3, resident=True, close_after=0.3)
    graph, names = fit_graph("late joiner, islands", strategy, n_epochs=24)
    R.execute()
    wait_for(lambda: max(seen["steps_done"] for seen in contributions(graph)[repr(strategy)].values()) >= 6,
             "two rounds done")
    late, = workers.start(1, prefix="late", extra=["--emulate-device-flops", "1e5"])
    R.track_progress(timeout=300, progress_bar=False)
    seen = contributions(graph)[repr(strategy)]
    assert any(late in role["workers"] for role in seen.values()), seen
    assert {w for role in seen.values() for w in role["workers"]} <= set(first) | {late}
    assert seen["replica 0"]["rounds_without"] == []   # the coordinator is never skipped
    # every replica ran all its rounds (a late round is dropped, not skipped: its steps are run)
    assert all(role["steps_done"] == role["steps"] == 96 for role in seen.values()), seen
    assert any(role["rounds_without"] for role in seen.values()), seen   # some round closed without a replica
    assert all(R.fetch_persisting_op(name).isfinite().all() for name in names)


def test_a_claim_by_another_worker_appends_it_to_the_holders_and_the_record_is_bounded(client):
    keys = GraphKeys(f"t{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:12])
    client.hset(keys.meta, "state", RUNNING)
    client.hset(keys.subgraphs, 0, b"plan bytes")
    scripts = Scripts(client)
    for worker in ("a", "a", "b", "a"):   # the same worker again (its own turn resumed) adds nothing
        assert scripts.claim(keys, 0, worker)[0].decode() == CLAIM_REPLIES["RUN"]
    assert client.hget(keys.held, 0) == b"a,b,a"
    for k in range(600):
        scripts.claim(keys, 0, f"worker-{k}")
    held = client.hget(keys.held, 0).decode().split(",")
    assert len(",".join(held)) <= HELD_CHARS + len("worker-599") and held[-1] == "worker-599"
    assert held[0].startswith("worker-") and held == [f"worker-{k}" for k in range(600 - len(held), 600)]
    client.delete(*client.keys(keys.prefix + "*"))
