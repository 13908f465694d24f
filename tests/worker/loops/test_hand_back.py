"""Which waiting loop gives its worker up (worker/loops/hand_back.py): only when more loops wait for a worker than
idle workers can take, and then only as many as are missing: the busy workers with the smallest names. On a
real server: a provider killed under N resident replicas on N + 1 workers moves only its own replica (to the
spare), the survivors never hand theirs back, and the results are the bits of the in-process run; replicas
taking turns on one worker resume from the values it kept, with the same bits."""
import json
import time

import pytest

import ravop as R
from ravop.store import GROUP, GraphKeys
from ravop.store import workers as liveness
from ravop.store.keys import worker_key, workers_set
from helpers import wait_for
from test_resident_replicas import assert_same_as_in_process, checkpointed_replica, record_small
from worker.loops.hand_back import PATIENCE_DEAD_AFTERS, HandBack
from worker.serve.takeover import Takeover

STREAM, KIND = "test-hand-back", "handbackkind"


@pytest.fixture
def stream(client):
    """A work stream of its own, and no live worker of its kind."""
    keys = [STREAM, workers_set(KIND)] + [worker_key(name) for name in "abcd"]
    client.delete(*keys)
    client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    yield client
    client.delete(*keys)


def live(client, *names):
    pipe = client.pipeline(transaction=False)
    for name in names:
        liveness.beat(pipe, name, KIND, ttl=60)
    pipe.execute()


def holds(client, name):
    """`name` reads (and so holds) one new message."""
    client.xadd(STREAM, {"loop": name})
    client.xreadgroup(GROUP, name, {STREAM: ">"}, count=1)


def rule(client, name, patience=60.0):
    """worker/loops/hand_back.py's rule for worker `name`, which declares a worker dead at once."""
    return HandBack(client, STREAM, KIND, name, Takeover(client, STREAM, name, 0.0, 30.0, None),
                    patience / PATIENCE_DEAD_AFTERS)   # waits `patience` s with idle workers


def decide(client, name):
    return rule(client, name).now()


def test_no_queued_work_no_hand_back(stream):
    live(stream, "a", "b")
    holds(stream, "a")
    holds(stream, "b")
    assert not decide(stream, "a") and not decide(stream, "b")


def test_with_fewer_workers_than_loops_only_the_smallest_busy_worker_yields(stream):
    live(stream, "b", "a")
    holds(stream, "a")
    holds(stream, "b")
    stream.xadd(STREAM, {"loop": "queued"})
    assert decide(stream, "a") and not decide(stream, "b")


def test_as_many_of_the_smallest_busy_workers_yield_as_loops_wait_beyond_the_idle_workers(stream):
    live(stream, "c", "a", "b")
    for name in "abc":
        holds(stream, name)
    stream.xadd(STREAM, {"loop": "queued 1"})
    stream.xadd(STREAM, {"loop": "queued 2"})
    assert [decide(stream, name) for name in "abc"] == [True, True, False]
    live(stream, "d")   # joins idle: it takes one of the two, so one worker yields for the other
    assert [decide(stream, name) for name in "abc"] == [True, False, False]


def test_an_idle_live_worker_takes_the_queued_loop_so_no_one_yields(stream):
    live(stream, "a", "b", "c")   # c holds nothing
    holds(stream, "a")
    holds(stream, "b")
    stream.xadd(STREAM, {"loop": "queued"})
    assert not decide(stream, "a") and not decide(stream, "b")


def test_a_dead_workers_loop_moves_to_one_survivor_only(stream):
    live(stream, "b", "c")
    holds(stream, "a")   # a's heartbeat key never existed: dead, its message claimable
    holds(stream, "b")
    holds(stream, "c")
    assert decide(stream, "b") and not decide(stream, "c")
    live(stream, "d")    # a provider joins: it takes the dead worker's loop, the survivors keep theirs
    assert not decide(stream, "b") and not decide(stream, "c")


def test_a_loop_that_idle_workers_leave_waiting_past_the_patience_makes_one_worker_yield(stream):
    live(stream, "a", "b", "c")   # c is idle but does not take the queued loop (say the graph banned it)
    holds(stream, "a")
    holds(stream, "b")
    stream.xadd(STREAM, {"loop": "queued"})
    patient = {name: rule(stream, name, patience=0.5) for name in "ab"}
    assert not patient["a"].now() and not patient["b"].now()
    time.sleep(0.6)
    assert patient["a"].now() and not patient["b"].now()


def logged_hand_backs(workers, name):
    return workers.log_path(name).read_text(errors="replace").count("handed back")


def test_a_killed_provider_moves_only_its_replica_to_the_spare(engine, workers, client):
    # paced to a slow device (a sleep after each step, whatever the host's load): the replicas run for ~10 s, so
    # they are still running when the spare, started below, has registered (it took 3 s on a loaded CI machine:
    # at full speed the replicas had finished by then and no checkpoint was left to find)
    replicas = workers.start(3, reclaim_idle=1.0, extra=("--checkpoint-steps", "40", "--verbose",
                                                         "--emulate-device-flops", "1e5"))
    graph, persisted = record_small("hand back kill", 150, replicas=3)
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    roles = json.loads(client.hget(keys.meta, "summary"))["replica_subgraphs"]
    loops = [s for by_role in roles.values() for subgraphs in by_role.values() for s in subgraphs]
    held = wait_for(lambda: len(client.hmget(keys.taken, loops)) == 3 and None not in client.hmget(keys.taken, loops)
                    and {s: client.hget(keys.taken, s).decode() for s in loops}, "each replica taken")
    assert sorted(held.values()) == sorted(replicas), held
    # The spare declares a worker dead after 6 s (and takes over no silent message before 30 s), the others after
    # 3: for 3 s the killed worker's replica is claimable while the spare, idle, has not taken it yet. A rule that
    # asks only "is work waiting?" makes the survivors hand their replicas back in that window.
    (spare,) = workers.start(1, reclaim_idle=30.0, extra=("--checkpoint-steps", "40", "--verbose",
                                                         "--dead-after", "6"), prefix="spare")
    loop_id, holder = checkpointed_replica(client, keys)
    workers.kill(holder)
    R.track_progress(timeout=600, progress_bar=False)
    for loop, worker in held.items():
        # the killed replica resumed on the spare; each other replica ended on the worker that started it
        assert client.hget(keys.ran, loop).decode() == (spare if worker == holder else worker), (loop, worker)
    for survivor in set(replicas) - {holder}:
        # never handed back: it kept its shard and values, and read neither from the store again
        assert logged_hand_backs(workers, survivor) == 0, workers.log(survivor)
    assert logged_hand_backs(workers, spare) == 0, workers.log(spare)
    assert_same_as_in_process(graph, persisted)


def test_replicas_taking_turns_on_one_worker_resume_from_the_values_it_kept_with_the_same_bits(
        engine, workers, client):
    (name,) = workers.start(1, extra=("--verbose",))
    graph, persisted = record_small("hand back turns", 30)
    R.activate()
    R.execute()
    R.track_progress(timeout=600, progress_bar=False)
    log = workers.log_path(name).read_text(errors="replace")
    assert log.count("handed back") >= 2, log[-3000:]
    # each replica taken back after its first turn resumes from the values its worker kept, not the store's
    assert log.count("kept by this worker, not read from the store") >= log.count("handed back") - 2, log[-3000:]
    assert_same_as_in_process(graph, persisted)
