"""DiLoCo rounds that close with the replicas present (`close_after`, Decoupled DiLoCo's islands): the exchange's
bounded wait for optional values and its recorded choice (worker/loops/exchange.py) on a real server, and fits on
real workers: nothing late gives the bits of the fit without `close_after`; a replica held back (SIGSTOP) past the
bound does not hold the others, and the fit ends; a replica killed (SIGKILL) and resumed late drops the round that
closed without it instead of staying late (worker/loops/late_rounds.py)."""
import os
import signal
import time
import uuid

import pytest
import torch

import ravop as R
from helpers import wait_for
from ravop.client.placement import held_by
from ravop.core.graph_states import RUNNING
from ravop.store import GraphKeys
from test_exchange_pipelined import exchange
from test_parallel_engine import assert_same_as_in_process
from test_parallel_math import X, Y, ravdl_net, torch_net
from worker.loops.late_rounds import droppable


@pytest.fixture
def keys(client):
    keys = GraphKeys(f"t{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:12])
    client.hset(keys.meta, "state", RUNNING)
    yield keys
    client.delete(*client.keys(keys.prefix + "*"))


def test_optional_values_are_waited_for_a_bounded_time_and_the_choice_is_replayed(client, keys):
    sender, receiver = exchange(client, keys), exchange(client, keys)
    sender.send(["up.0"], 0, [torch.ones(3)])
    sender.flush()
    started = time.monotonic()
    got = receiver.receive(["up.0", "up.1"], 0, [False, True], 0.3)
    assert 0.3 <= time.monotonic() - started < 5
    assert torch.equal(got[0], torch.ones(3)) and got[1] is None
    sender.send(["up.1"], 0, [torch.full((3,), 2.0)])   # late: the run went without it, and a replay does too
    sender.flush()
    replay = exchange(client, keys).receive(["up.0", "up.1"], 0, [False, True], 0.3)
    assert replay[1] is None
    sender.send(["up.0", "up.1"], 1, [torch.ones(3), torch.ones(3)])
    sender.flush()
    on_time = receiver.receive(["up.0", "up.1"], 1, [False, True], 30)
    assert all(torch.equal(v, torch.ones(3)) for v in on_time)
    assert client.get(keys.exchange("without.up.0", 1)) == b"[]"
    sender.close(), receiver.close()


def test_bad_close_after_is_refused_by_name():
    with pytest.raises(ValueError, match="close_after must be None or seconds > 0"):
        R.parallel.DiLoCo(2, 4, close_after=0)
    with pytest.raises(ValueError, match="close_after needs resident replicas"):
        R.parallel.DiLoCo(2, 4, close_after=5, resident=False)
    assert repr(R.parallel.DiLoCo(2, 4, close_after=5)).endswith("close_after=5)")


def fit_graph(name, strategy, n_epochs=4):
    graph = R.Graph(name=name, seed=11)
    model = ravdl_net(torch_net())
    history = model.fit(X, Y, n_epochs=n_epochs, batch_size=4, shuffle=True, seed=3, strategy=strategy)
    model.predict(X).persist_op("prediction")
    R.activate()
    fit_graph.history = history
    return graph, list(history) + ["prediction"]


def test_rounds_with_everyone_present_give_the_bits_without_close_after(engine, workers, client):
    workers.start(2)
    graph, names = fit_graph("islands all present", R.parallel.DiLoCo(2, 3, resident=True, close_after=60))
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    assert_same_as_in_process(graph, names)   # in one process no replica is late: the plain means
    got = {name: R.fetch_persisting_op(name) for name in names}
    graph, _ = fit_graph("plain", R.parallel.DiLoCo(2, 3, resident=True))
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    assert all(torch.equal(R.fetch_persisting_op(name), got[name]) for name in names)


def test_a_replica_held_back_does_not_hold_the_others(engine, workers, client):
    # steps of a few ms, so that the fit lasts; a stopped worker is neither dead nor idle for the other: this
    # tests the round's bound, not a takeover (the churn's)
    names = workers.start(2, reclaim_idle=60.0, extra=["--emulate-device-flops", "1e5", "--dead-after", "60"])
    strategy = R.parallel.DiLoCo(2, 3, resident=True, close_after=0.3)
    started = time.monotonic()
    graph, persisted = fit_graph("islands late", strategy, n_epochs=40)
    R.execute()
    deadline = time.monotonic() + 120
    while not held_by(graph).get(repr(strategy), {}).get("replica 1"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    late = held_by(graph)[repr(strategy)]["replica 1"][0]
    pid = workers.procs[late].pid
    os.kill(pid, signal.SIGSTOP)   # replica 1's worker stops for 1.5 s: the rounds then close without it
    time.sleep(1.5)
    os.kill(pid, signal.SIGCONT)
    R.track_progress(timeout=300, progress_bar=False)
    print(f"fit {time.monotonic() - started:.1f} s")
    keys = GraphKeys(engine.token, graph.id)
    choices = [client.get(key) for key in client.keys(keys.exchange("without.present.1", "*"))]
    assert len(choices) == 80 and b"[]" in choices, choices   # a choice recorded per round: most went with it
    assert any(choice != b"[]" for choice in choices), choices   # and some without replica 1
    assert late in names
    seen = fit_graph.history.contributions[repr(strategy)]   # what `history` tells of each replica
    assert seen["replica 1"]["workers"][0] == late and seen["replica 1"]["rounds"] == 80
    assert seen["replica 0"]["rounds_without"] == []
    assert seen["replica 1"]["rounds_without"] == [run for run, choice in enumerate(
        client.mget([keys.exchange("without.present.1", run) for run in range(80)])) if choice != b"[]"]
    assert 0 < len(seen["replica 1"]["rounds_without"]) < 80
    prediction = R.fetch_persisting_op("prediction")
    assert torch.isfinite(prediction).all()


@pytest.mark.parametrize("overlap, start, drops", [(False, "global", True), (True, "global", True),
                                                   (True, "local", False)])
def test_only_replicas_whose_down_needs_nothing_their_up_made_drop_a_late_round(overlap, start, drops):
    graph = R.Graph(name="droppable", seed=11)
    ravdl_net(torch_net()).fit(X, Y, n_epochs=2, batch_size=4, strategy=R.parallel.DiLoCo(
        2, 3, resident=True, close_after=1, overlap=overlap, overlap_start=start, compression="int8"))
    found = {}
    for record in graph.loops.values():
        spec = record.spec
        sends = [s.channel for t in spec.templates for s in t.sent]
        found["replica 1" if any(c.startswith("up.1.") for c in sends) else "replica 0"] = \
            droppable(spec.templates, spec.sync_templates, spec.close_after_s)
    # replica 0 closes the rounds; replica 1 marks by its first value sent, unless `down` subtracts what `up` sent
    assert found == {"replica 0": None, "replica 1": "up.1.0" if drops else None}
    spec = next(r.spec for r in graph.loops.values())
    assert droppable(spec.templates, spec.sync_templates, 0.0) is None   # rounds that wait for everyone


def test_a_replica_killed_and_resumed_late_drops_the_round_that_closed_without_it(engine, workers, client):
    # rounds of 60 steps paced to ~1 s, closing 0.3 s after replica 0 arrives; replica 1's worker is SIGKILLed
    # after a checkpoint and the spare resumes it seconds behind: it would stay behind, and replica 0 wait 0.3 s for
    # it at every round until the lag was gone, each such round going without it
    workers.start(3, reclaim_idle=1.0, extra=["--emulate-device-flops", "1e5", "--dead-after", "1",
                                              "--checkpoint-seconds", "0.3"])
    strategy = R.parallel.DiLoCo(2, 60, resident=True, close_after=0.1)
    graph, persisted = fit_graph("islands killed", strategy, n_epochs=120)   # 720 steps a replica: 12 rounds
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    late = wait_for(lambda: held_by(graph).get(repr(strategy), {}).get("replica 1"), "replica 1 taken")[0]
    loop_id = next(s for s, w in client.hgetall(keys.taken).items() if w.decode() == late)
    wait_for(lambda: client.hexists(keys.checkpoint(loop_id.decode()), "step"), "replica 1's checkpoint")
    workers.kill(late)
    R.track_progress(timeout=300, progress_bar=False)
    seen = fit_graph.history.contributions[repr(strategy)]["replica 1"]
    assert seen["workers"][0] == late and len(seen["workers"]) == 2   # the spare resumed it
    # the rounds that closed without it were marked for it, and it dropped the rest of them (their steps' losses
    # never computed) instead of running them late: without that every step's loss is there
    assert seen["rounds_without"], seen
    assert all(client.exists(keys.exchange("late.up.1.0", run)) for run in seen["rounds_without"])
    losses = R.fetch_losses()
    dropped = int((~losses.batch_stored).sum())
    assert 0 < dropped < 60 * len(seen["rounds_without"]), (dropped, seen["rounds_without"])
    assert torch.isfinite(R.fetch_persisting_op("prediction")).all()
