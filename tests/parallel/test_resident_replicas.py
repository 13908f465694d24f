"""Resident DiLoCo replicas (ravop/parallel/resident.py): one loop per replica for the whole fit, exchanging only
(compressed) pseudo-gradients and updates. They give the bits of the segment recording in-process (threads) and
on a real server with worker processes, move only a bounded number of bytes per round (measured by the server's
own network counters), survive a provider killed mid-round with the same bits, and their plan does not grow with
the number of rounds."""
import re

import numpy as np
import pytest
import torch

from compiler.compile import compile_graph
import ravop as R
from ravop.core import graph_states
from helpers import on_one_thread, wait_for
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.client.placement import contributions, held_by
from ravop.runtime.evaluate import evaluate_persisted
from ravop.runtime.loop_run import MemoryExchange
from ravop.store import GraphKeys
from test_diloco import PARAM_NAMES, assert_matches_reference, fit_diloco
from test_parallel_math import X, Y, ravdl_net, torch_net
from worker.loops.checkpoint_aliases import decode
from worker.loops.shared_checkpoint import decode as decode_shared, value_key as shared_value_key


def knobs(compression, **more):
    return dict(replicas=2, inner_steps=3, compression=compression, **more)


@pytest.mark.parametrize("compression, overlap, start", [
    (None, False, "global"), ("fp16", False, "global"), ("int8", False, "global"), (None, True, "global"),
    ("int8", True, "global"), (None, True, "local"), ("int8", True, "local")])
def test_resident_replicas_give_the_bits_of_segments_and_match_eager_pytorch(compression, overlap, start):
    more = dict(overlap=overlap, overlap_start=start)
    resident = fit_diloco(R.parallel.DiLoCo(**knobs(compression, resident=True, **more)), 2, 5)
    segments = fit_diloco(R.parallel.DiLoCo(**knobs(compression, resident=False, **more)), 2, 5)
    assert resident[0].keys() == segments[0].keys()
    for name in resident[0]:
        assert torch.equal(resident[0][name], segments[0][name]), name
    for name in PARAM_NAMES + ["prediction"]:
        assert torch.equal(resident[1][name], segments[1][name]), name
    assert_matches_reference(R.parallel.DiLoCo(**knobs(compression, resident=True, outer_momentum=0.8, **more)))


def test_resident_knob_is_checked():
    with pytest.raises(TypeError, match="resident"):
        R.parallel.DiLoCo(2, 3, resident="yes")
    assert "resident=True" in repr(R.parallel.DiLoCo(2, 3, resident=True))


def plan_of(inner_steps, resident):
    graph = R.Graph(name=f"rounds {inner_steps}", seed=11)
    model = ravdl_net(torch_net())
    model.fit(X, Y, n_epochs=4, batch_size=6, strategy=R.parallel.DiLoCo(2, inner_steps, resident=resident))
    model.persist_weights()
    plan = compile_graph(graph).plan
    nodes = sum(len(s.nodes.id) + sum(len(t.nodes.id) for t in s.loop.templates) for s in plan.subgraphs)
    plan.ClearField("persisted")   # the loss names: one per step, whatever the number of rounds
    return nodes, plan.ByteSize()


def test_rounds_are_folded_the_plan_does_not_grow_with_their_number():
    # 24 rows per replica in batches of 6: 16 steps; 2 rounds of 8 steps, or 16 rounds of 1
    few, many = plan_of(8, True), plan_of(1, True)
    assert few[0] == many[0]
    assert abs(few[1] - many[1]) <= 16   # varints only
    unfolded_few, unfolded_many = plan_of(8, False), plan_of(1, False)
    assert unfolded_many[0] > 4 * unfolded_few[0]   # the segment recording grows with the rounds


def test_an_exchanging_loop_refuses_to_run_without_an_exchange():
    from ravop.core.errors import PlanError
    from ravop.runtime.loop_run import LoopRun
    graph = R.Graph(name="no exchange", seed=1)
    model = ravdl_net(torch_net())
    model.fit(X, Y, n_epochs=1, batch_size=6, strategy=R.parallel.DiLoCo(2, 2, resident=True))
    loop_id, record = next(iter(graph.loops.items()))
    inputs = [graph.constants[i.id] if i.id in graph.constants else None for i in graph.nodes[loop_id].inputs]
    with pytest.raises(PlanError, match="exchanges values with other loops"):
        LoopRun(record.spec, [torch.zeros(()) if v is None else v for v in inputs], 1).run()


def server_bytes(client):
    stats = client.info("stats")
    return int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])


def mlp_fit(name, rows, n_epochs, strategy):
    """A fit of an MLP 784-256-10 on `rows` random rows under `strategy`, run on the workers; returns the number
    of parameters."""
    rng = np.random.default_rng(0)
    X_big = rng.normal(size=(rows, 784)).astype(np.float32)
    Y_big = np.eye(10, dtype=np.float32)[rng.integers(0, 10, rows)]
    R.Graph(name=name, seed=3)
    model = NeuralNetwork(Adam(lr=0.001), loss="CrossEntropy")
    model.add(Dense(256, input_shape=(784,)))
    model.add(Activation("relu"))
    model.add(Dense(10))
    model.fit(X_big, Y_big, n_epochs=n_epochs, batch_size=32, strategy=strategy)
    model.persist_weights()
    R.activate()
    R.execute()
    R.track_progress(timeout=600, progress_bar=False)
    return 784 * 256 + 256 + 256 * 10 + 10


@pytest.mark.parametrize("compression, bound", [("int8", 2.5), (None, 2.5 * 4)])
def test_bytes_per_round_per_replica_are_within_a_bound_of_the_parameter_size(engine, workers, client,
                                                                               compression, bound):
    # checkpoints off: this measures what the algorithm exchanges (a checkpoint is the fallback, priced apart)
    workers.start(2, extra=("--checkpoint-steps", "1000000", "--checkpoint-seconds", "100000",
                            "--resident-checkpoint-seconds", "100000"))
    rows = 2 * 32 * 32   # per replica 32 steps of 32 rows an epoch: 2 rounds of 16 steps an epoch
    totals = []
    for n_epochs in (1, 4):
        before = server_bytes(client)
        n_params = mlp_fit(f"bytes {compression} {n_epochs}", rows, n_epochs,
                           R.parallel.DiLoCo(2, inner_steps=16, compression=compression, resident=True))
        totals.append(server_bytes(client) - before)
    per_round_per_replica = (totals[1] - totals[0]) / ((4 - 1) * 2) / 2
    print(f"{compression}: {per_round_per_replica:.0f} bytes per round per replica, "
          f"{per_round_per_replica / n_params:.2f}x the int8 parameters ({n_params} bytes); run totals {totals}")
    assert per_round_per_replica <= bound * n_params


def record_small(name, epochs, compression="int8", overlap=False, replicas=2):
    graph = R.Graph(name=name, seed=11)
    model = ravdl_net(torch_net())
    persisted = list(model.fit(X, Y, n_epochs=epochs, batch_size=6, shuffle=True, seed=3,
                               strategy=R.parallel.DiLoCo(replicas, 4, compression=compression, resident=True,
                                                          overlap=overlap)))
    model.persist_weights()
    model.predict(X).persist_op("prediction")
    return graph, persisted + PARAM_NAMES + ["prediction"]


def assert_same_as_in_process(graph, names):
    want = on_one_thread(evaluate_persisted, graph, names)
    for name in names:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name


def test_replicas_run_on_distinct_workers_with_the_in_process_bits(engine, workers, client):
    names = workers.start(2)
    graph, persisted = record_small("resident engine", 3)
    R.activate()
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    keys = GraphKeys(engine.token, graph.id)
    loops = [int(s) for s in client.hkeys(keys.ran) if client.hget(keys.ran, s)]
    assert {client.hget(keys.ran, s).decode() for s in loops} == set(names)
    assert client.exists(keys.exchange("up.1.0", 0)) and client.exists(keys.exchange("down.0", 0))
    assert_same_as_in_process(graph, persisted)


def test_overlapped_resident_replicas_on_three_workers_give_the_in_process_bits(engine, workers, client):
    workers.start(3)
    graph, persisted = record_small("resident overlap", 3, overlap=True, replicas=3)
    R.activate()
    R.execute()
    R.track_progress(timeout=300, progress_bar=False)
    assert_same_as_in_process(graph, persisted)


def test_with_overlap_replica_0_sends_each_update_right_after_its_outer_step_and_a_zero_one_first():
    graph = R.Graph(name="overlap templates", seed=11)
    ravdl_net(torch_net()).fit(X, Y, n_epochs=1, batch_size=6, strategy=R.parallel.DiLoCo(3, 2, resident=True,
                                                                                          overlap=True))
    replica_0, replica_1, _ = [record.spec for record in graph.loops.values()]
    outer, send = [replica_0.templates[t] for t in replica_0.sync_templates]
    assert not send.received and {s.channel.split(".")[0] for s in send.sent} == {"down"}   # no buffers
    assert not outer.sent and {r.channel.split(".")[0] for r in outer.received} == {"up"}
    assert replica_0.before_first == [replica_0.sync_templates[1]]
    up, down = [replica_1.templates[t] for t in replica_1.sync_templates]
    assert {r.channel.split(".")[0] for r in down.received} == {"down"} and not down.sent
    assert not replica_1.before_first
    # a shard of 16 rows in batches of 6: 3 steps, syncs after steps 2 and 3; `send` also runs before the first
    o, s = replica_0.sync_templates
    assert replica_0.runs(o) == 2 and replica_0.runs(s) == 3 and replica_0.n_steps == 3 + 2 * 2 + 1


class _Gate(MemoryExchange):
    """A MemoryExchange that counts, per run of the `down` channels, the replicas that have received it."""

    def __init__(self):
        super().__init__(timeout=120)
        self.down_received = {}

    def receive(self, channels, run):
        values = super().receive(channels, run)
        if channels and channels[0].startswith("down."):
            with self.changed:
                self.down_received[run] = self.down_received.get(run, 0) + 1
                self.changed.notify_all()
        return values


def test_with_overlap_the_replicas_receive_update_k_minus_1_while_replica_0_waits_before_round_k(monkeypatch):
    """Replica 0 held after each sync k - 1 (k >= 1) until the other replicas have received update k - 1: they
    get it without replica 0 training round k (they never wait for replica 0's arrival at sync k), with the same
    bits."""
    import ravop.runtime.evaluate as interpreter
    graph, names = record_small("overlap gate", 4, compression="int8", overlap=True, replicas=3)
    want = on_one_thread(evaluate_persisted, graph, names)
    gate, held, order = _Gate(), [], []

    class GatedRun(interpreter.LoopRun):
        def run(self, *args, on_step=None, exchange=None, **kwargs):
            templates, syncs = self.loop.templates, self.loop.sync_templates
            if not any(r.channel.startswith("up.") for t in templates for r in t.received):
                return super().run(*args, on_step=on_step, exchange=exchange, **kwargs)
            outer = next(t for t in syncs if any(r.channel.startswith("up.") for r in templates[t].received))
            outer_steps = []

            def hold(done, template, run, values, carried):
                on_step(done, template, run, values, carried)
                order.append(template)
                outer_steps.extend([run] if template == outer else [])
                if template == syncs[-1] and 0 < len(outer_steps) < self.loop.n_syncs():   # before round k
                    k = len(outer_steps)
                    with gate.changed:
                        assert gate.changed.wait_for(lambda: gate.down_received.get(k, 0) == 2, 60), \
                            f"replica 0, held before round {k}, waited for the others to receive update {k - 1}"
                    held.append(k)
            return super().run(*args, on_step=hold, exchange=exchange, **kwargs)
    monkeypatch.setattr(interpreter, "MemoryExchange", lambda: gate)
    monkeypatch.setattr(interpreter, "LoopRun", GatedRun)
    got = on_one_thread(evaluate_persisted, graph, names)
    # a shard of 16 rows in batches of 6, 4 epochs: 12 steps, 3 rounds of 4: held before rounds 1 and 2
    assert held == [1, 2]
    outer, send = graph.loops[min(graph.loops)].spec.sync_templates
    assert order[0] == send and [order[k + 1] for k, t in enumerate(order) if t == outer] == [send] * 3
    for name in names:
        assert torch.equal(got[name], want[name]), name


def checkpointed_replica(client, keys):
    """(loop subgraph id, worker holding it) of the first replica to publish a checkpoint, still running."""
    def found():
        checkpoints = [key for key in client.keys(keys.prefix + "ckpt:*")
                       if re.fullmatch(rb".*ckpt:\d+", key) and client.hexists(key, "step")]
        assert checkpoints or client.hget(keys.meta, "state").decode() not in graph_states.ENDED, \
            "the graph ended before any replica's checkpoint was seen: make the fit longer or the replicas slower"
        return checkpoints
    checkpointed = wait_for(found, "a replica's checkpoint")
    loop_id = checkpointed[0].decode().rsplit(":", 1)[1]
    assert not client.sismember(keys.done, loop_id), "the replica ended before the kill: make the fit longer"
    return loop_id, client.hget(keys.taken, loop_id).decode()


def run_killing_a_replica(engine, workers, client, graph):
    """Run `graph`, SIGKILL the worker holding the first replica to checkpoint, wait until the graph is done;
    returns (its GraphKeys, that replica's loop subgraph id, the killed worker)."""
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    loop_id, holder = checkpointed_replica(client, keys)
    workers.kill(holder)
    R.track_progress(timeout=600, progress_bar=False)
    return keys, loop_id, holder


@pytest.mark.parametrize("overlap", [False, True])
def test_a_provider_killed_mid_round_is_resumed_elsewhere_with_the_same_bits(engine, workers, client, overlap):
    names = workers.start(3, reclaim_idle=1.0, extra=("--checkpoint-steps", "40"))
    graph, persisted = record_small(f"resident kill {overlap}", 150, overlap=overlap)
    keys, loop_id, holder = run_killing_a_replica(engine, workers, client, graph)
    assert client.hget(keys.ran, loop_id).decode() in set(names) - {holder}   # a spare took the replica over
    (replicas,) = held_by(graph).values()
    taker = client.hget(keys.ran, loop_id).decode()
    # the takeover shows as a second worker for the replica: the killed one first, then the one that ended it
    assert [holder, taker] in replicas.values(), replicas
    (seen,) = contributions(graph).values()
    assert [holder, taker] in [role["workers"] for role in seen.values()]
    assert_same_as_in_process(graph, persisted)


def test_checkpoints_at_synchronisations_store_the_global_model_once_and_resume_with_the_same_bits(
        engine, workers, client):
    # by default a resident replica checkpoints by time only, at a synchronisation: 0 s makes it every one
    workers.start(3, reclaim_idle=1.0, extra=("--resident-checkpoint-seconds", "0"))
    graph, persisted = record_small("resident sync checkpoints", 150)
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    loop_id, holder = checkpointed_replica(client, keys)
    step, n, same, shared = client.hmget(keys.checkpoint(loop_id), "step", "n", "same", "shared")
    # right after a synchronisation the replica's parameters are the global model it carries: stored once
    assert len(decode(same, int(n))) >= len(PARAM_NAMES), f"checkpoint at step {int(step)}: {same}"
    # the other values by digest, where the other replica's checkpoint at that synchronisation finds them
    assert len(decode_shared(shared, int(n))) == int(n) - len(decode(same, int(n))), shared
    workers.kill(holder)
    R.track_progress(timeout=600, progress_bar=False)
    assert_same_as_in_process(graph, persisted)
    # the loops drop their checkpoints as they end: the last reference to each shared value deletes it
    wait_for(lambda: not client.keys(shared_value_key(keys, "*")), "the shared checkpoint values deleted")


def test_a_long_round_is_checkpointed_within_and_a_provider_killed_there_resumes_from_it_with_the_same_bits(
        engine, workers, client):
    # rounds of 40 steps paced to ~1 s (a 2.3 kFLOP step at 1e5 FLOP/s), a checkpoint interval of 0.3 s, and the
    # synchronisations' own cadence out of the way (1000 s): every checkpoint is taken within a round
    workers.start(3, reclaim_idle=1.0, extra=("--checkpoint-seconds", "0.3", "--resident-checkpoint-seconds",
                                              "1000", "--emulate-device-flops", "1e5"))
    graph = R.Graph(name="resident long rounds", seed=11)
    model = ravdl_net(torch_net())
    persisted = list(model.fit(X, Y, n_epochs=30, batch_size=6, shuffle=True, seed=3,
                               strategy=R.parallel.DiLoCo(2, 40, compression="int8", resident=True)))
    model.persist_weights()
    model.predict(X).persist_op("prediction")
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    loop_id, holder = checkpointed_replica(client, keys)
    step = int(client.hget(keys.checkpoint(loop_id), "step"))
    workers.kill(holder)
    R.track_progress(timeout=600, progress_bar=False)
    # the takeover resumed from that checkpoint or a later one of the same kind, not from the fit's start
    message, deliveries, resumed_from, failures = client.hget(keys.attempts, loop_id).decode().split(" ")
    assert int(resumed_from) >= step > 0 and int(deliveries) == 2, (step, resumed_from)
    assert_same_as_in_process(graph, persisted + PARAM_NAMES + ["prediction"])


def test_replicas_outnumbering_workers_take_turns_and_a_joining_worker_takes_one(engine, workers, client):
    first = workers.start(1)
    graph, persisted = record_small("resident queue", 30)
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    # one worker: a replica waiting for the other hands its loop back (with a checkpoint) and takes the other
    wait_for(lambda: [key for key in client.keys(keys.prefix + "ckpt:*") if re.fullmatch(rb".*ckpt:\d+", key)],
             "a replica handed back with a checkpoint")
    joined = workers.start(1, prefix="late")
    R.track_progress(timeout=600, progress_bar=False)
    ran = {client.hget(keys.ran, s).decode() for s in client.hkeys(keys.ran)}
    assert ran <= set(first + joined) and joined[0] in ran   # the joining worker finished some of the work
    assert_same_as_in_process(graph, persisted)


def test_the_survivor_takes_over_a_killed_workers_replica_without_a_spare(engine, workers, client):
    names = workers.start(2, reclaim_idle=1.0, extra=("--checkpoint-steps", "40", "--dead-after", "2"))
    graph, persisted = record_small("resident kill no spare", 40)
    keys, loop_id, holder = run_killing_a_replica(engine, workers, client, graph)
    survivor = next(n for n in names if n != holder)
    assert client.hget(keys.ran, loop_id).decode() == survivor   # it took turns with its own replica
    assert_same_as_in_process(graph, persisted)


def test_in_process_a_failing_replica_stops_the_others_with_its_error(monkeypatch):
    from ravop.runtime.loop_run import StepFunction
    graph = R.Graph(name="failing replica", seed=11)
    model = ravdl_net(torch_net())
    model.fit(X, Y, n_epochs=2, batch_size=6, strategy=R.parallel.DiLoCo(2, 2, resident=True))
    model.persist_weights()
    real = StepFunction.sent

    def broken(self):
        if any(channel.startswith("down.") for channel in self.send_channels):
            raise RuntimeError("replica 0 broke")
        return real(self)
    monkeypatch.setattr(StepFunction, "sent", broken)
    with pytest.raises(RuntimeError, match="replica 0 broke"):
        evaluate_persisted(graph)
