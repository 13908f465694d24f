"""Training that outlives its providers (issue 43), with real worker processes: the worker holding a fit's loop is
SIGKILLed again and again and replaced (once under the dead one's name); the fit ends with the bits of eager
PyTorch, losses, parameters and saved model included, though each worker allows only 2 attempts: a takeover that
resumes from a newer checkpoint than the last one did is no failed attempt (worker/serve/attempts.py). A subgraph
that kills every worker taking it at the same point is still dead-lettered, the dead letter naming the step. In a
module of its own: its workers must be the only ones (another module's would take the loop too)."""
import re

import pytest
import torch

import ravop as R
from differential import ARCHS, OPTIMS, EagerTraining, build
from helpers import wait_for
from ravop.store import DEAD_LETTER, GraphKeys
from test_differential_engine import BATCH, ROWS, check, record_after_training
from worker.serve import attempts

# a checkpoint every 5 steps, and steps paced to ~4 ms so that the kills land mid-loop
PACED = ("--checkpoint-steps", "5", "--emulate-device-flops", "4e6")


def record_fit(epochs):
    """Record the differential matrix's MLP with BatchNorm trained by Adam; (built, loss names, names to fetch,
    eval rows, training rows)."""
    arch, optim = ARCHS["mlp_bn"], OPTIMS["adam"]
    X_eval = arch.data(arch.eval_rows)[0]
    built = build(arch, optim, "functional", arch.data(2)[0])
    X, y = arch.data(ROWS)
    loss_names = list(built.model.fit(X, y, n_epochs=epochs, batch_size=BATCH, loss=arch.loss))
    names = {**{name: None for name in loss_names}, **record_after_training(built, X_eval)}
    return built, loss_names, names, X_eval, (X, y)


def check_against_eager(built, loss_names, names, X_eval, data, epochs):
    fetched = {name: R.fetch_persisting_op(name) for name in names}
    got_losses = torch.stack([torch.as_tensor(fetched[name]) for name in loss_names])
    X, y = data
    batches = [(X[i:i + BATCH], y[i:i + BATCH]) for i in range(0, ROWS, BATCH)] * epochs
    want_losses = EagerTraining(ARCHS["mlp_bn"], OPTIMS["adam"], built.eager).steps(batches)
    check(built, fetched, got_losses, want_losses, X_eval, "functional")


def loop_holder(client, keys):
    """(loop subgraph id, the worker holding it) once the loop has checkpointed."""
    wait_for(lambda: any(client.type(key) == b"hash" and client.hexists(key, "step")
                         for key in client.keys(keys.prefix + "ckpt:*")), "a checkpoint")
    loop_id = next(int(s) for s in client.hkeys(keys.taken))
    return loop_id, client.hget(keys.taken, loop_id).decode()


def kill_past(workers, client, keys, loop_id, since):
    """SIGKILL the worker running the loop once it is alive and checkpointed past step `since`; (the step of
    the checkpoint it left, which the next attempt resumes from, the worker's name)."""
    def ready():
        assert not client.sismember(keys.done, loop_id), "the loop ended before its kills: make it longer"
        step, holder = client.hget(keys.checkpoint(loop_id), "step"), client.hget(keys.taken, loop_id)
        if step is None or int(step) <= since or holder is None or not workers.alive(holder.decode()):
            return None
        return int(step), holder.decode()
    _, holder = wait_for(ready, f"a checkpoint past step {since} by a live worker")
    workers.kill(holder)
    # the step the next attempt resumes from: a checkpoint the worker was writing beside its loop as the signal came
    # may have landed after the step above was read (CI saw a kill land right after a takeover because of it)
    return int(client.hget(keys.checkpoint(loop_id), "step")), holder


def test_a_fit_whose_worker_is_killed_four_times_ends_with_eager_bits(engine, workers, client):
    """4 kills, each after the loop checkpointed past the last one, with --max-attempts 2: each takeover found
    progress, so none counts. The second replacement takes the dead worker's name (as systemd restarts a unit)."""
    workers.start(3, max_attempts=2, extra=("--dead-after", "1", *PACED))
    graph = R.Graph(name="churned fit")
    epochs = 2000
    recorded = record_fit(epochs)
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    loop_id, _ = loop_holder(client, keys)
    step = -1
    for kill in range(4):
        step, holder = kill_past(workers, client, keys, loop_id, step)
        # not waiting for the replacement to register: on a loaded machine its start (importing torch) outlasted
        # the loop, while the survivors carry it on meanwhile
        workers.start(1, max_attempts=2, extra=("--dead-after", "1", *PACED), name=holder if kill == 1 else None,
                      wait=False)
    R.track_progress(progress_bar=False, timeout=600)
    check_against_eager(*recorded, epochs)
    record = client.hget(keys.attempts, loop_id)
    assert record is not None and record.split()[-1] == b"0", record   # the last takeover found progress


def test_a_worker_restarted_under_its_name_resumes_its_predecessors_loop_at_once(engine, workers, client):
    """The only worker dies and comes back under its name. Others would wait for --reclaim-idle (120 s) to take
    a message whose holder's heartbeat is fresh again; the new process takes it at start, and the fit ends well
    within that, with eager's bits."""
    [name] = workers.start(1, reclaim_idle=120, extra=("--dead-after", "30", *PACED))
    graph = R.Graph(name="restarted fit")
    epochs = 300
    recorded = record_fit(epochs)
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    loop_id, holder = loop_holder(client, keys)
    assert holder == name
    workers.kill(name)
    workers.start(1, reclaim_idle=120, extra=("--dead-after", "30", *PACED), name=name)
    R.track_progress(progress_bar=False, timeout=90)
    check_against_eager(*recorded, epochs)
    assert client.hget(keys.attempts, loop_id) is not None   # resumed as a takeover, counted as one


def test_a_loop_that_kills_every_worker_at_the_same_step_is_dead_lettered_naming_it(engine, workers, client):
    """No checkpoints: each worker that takes the loop is SIGKILLed once it reports 60 steps, so no takeover finds
    progress; with --max-attempts 2 the third delivery gives up, and the dead letter says where they died."""
    no_checkpoints = ("--dead-after", "1", "--checkpoint-steps", "0", "--checkpoint-seconds", "1000",
                      "--emulate-device-flops", "4e6")
    workers.start(2, max_attempts=2, extra=no_checkpoints)
    graph = R.Graph(name="poison fit")
    record_fit(2000)
    R.activate()
    R.execute()
    keys = GraphKeys(engine.token, graph.id)
    loop_id = int(wait_for(lambda: client.hkeys(keys.taken), "the loop taken")[0])

    def poisoned():
        if client.hget(keys.meta, "state") != b"running":
            return "ended"
        steps, holder = client.hget(keys.steps, loop_id), client.hget(keys.taken, loop_id)
        if steps is None or int(steps) < 60 or holder is None or not workers.alive(holder.decode()):
            return None
        return holder.decode()

    for _ in range(2):
        holder = wait_for(poisoned, "the loop's worker at step 60")
        assert holder != "ended", "the graph ended before the poison's kills"
        workers.kill(holder)
        workers.start(1, max_attempts=2, extra=no_checkpoints)
    with pytest.raises(R.GraphFailedError, match="without progress") as info:
        R.track_progress(progress_bar=False, timeout=300)
    text = str(info.value)
    assert "each resumed from its start" in text, text
    reached = int(re.search(r"the last progress recorded was step (\d+)", text).group(1))
    assert reached >= 60, text
    dead = wait_for(lambda: [f for _, f in client.xrange(DEAD_LETTER) if f.get(b"graph") == graph.id.encode()],
                    "the dead letter")
    assert dead[0][b"reason"] == b"too many deliveries"
    assert f"step {reached}".encode() in dead[0][b"error"]


def test_redeliveries_count_as_failures_only_without_a_newer_checkpoint(client):
    """The count itself, on a real server: what each takeover of one message finds."""
    keys = GraphKeys("attempts-test", "g1")
    client.delete(keys.attempts, keys.checkpoint(0), keys.steps)
    first = attempts.count(client, keys, 0, b"1-0", 2)   # no record, no checkpoint: the first attempt failed
    assert (first.failures, first.resumed_from, first.where()) == (1, attempts.NO_CHECKPOINT, "")
    assert attempts.count(client, keys, 0, b"1-0", 2).failures == 1   # the same delivery resumed: not again
    client.hset(keys.checkpoint(0), mapping={"step": 40, "n": 1})
    client.hset(keys.steps, 0, 43)
    assert attempts.count(client, keys, 0, b"1-0", 3).failures == 0   # it checkpointed past where it resumed
    assert attempts.count(client, keys, 0, b"1-0", 4).failures == 1
    last = attempts.count(client, keys, 0, b"1-0", 5)
    assert last.failures == 2
    assert last.where() == " each resumed from its checkpoint at step 40 and died before the next checkpoint; " \
                           "the last progress recorded was step 43"
    # a handed-back loop is a new message: its deliveries count again from 1, its failures go on
    assert attempts.count(client, keys, 0, b"2-0", 2).failures == 3
    assert attempts.count(client, keys, 0, b"3-0", 5).failures == 4   # from the record, whatever the deliveries
    client.delete(keys.attempts, keys.checkpoint(0), keys.steps)
