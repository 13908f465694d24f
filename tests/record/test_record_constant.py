"""Recording a training loop costs O(1) in its steps: `fit(n_epochs=10**6)` and a hand-written loop of 10**9 steps
record in a fraction of a second and a fixed memory (persist names by rule, `ravop.core.loss_names.RunNames`; a
loop's runs counted, not listed), and both run: the fit until EarlyStopping ends it, the loop until a stop
request does, on a real server and worker processes, with the values of the same loop recorded that short.
Activating the fit is still O(n) in its persisted names (the plan and the store list one per step and epoch: about
2.5 minutes for these 2 million here, most of this file's time; docs/reports/benchmarks.md, issue 44)."""
import time
import tracemalloc

import numpy as np
import pytest
import torch

import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.callbacks import EarlyStopping
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.core.loss_names import STEP_RULE, TRAINING_BATCH_RULE, VALIDATION_RULE, RunNames
from ravop.record.loop import Loop
from ravop.runtime.evaluate import evaluate_persisted
from ravop.store import graphs as store_graphs
from ravop.tools import status

from helpers import wait_for

ROWS, BATCH = 16, 16   # 1 step an epoch: activation still lists every persisted name (one per step, per epoch)
# Generous bounds (the machine is shared): recording takes about 0.02 s and 0.1 MiB at any length.
SECONDS, PEAK_BYTES = 5.0, 4 * 2**20


def record_fit(epochs, callbacks=()):
    """A shuffled fit of `epochs` epochs; returns (History, seconds, peak traced bytes)."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(ROWS, 6)).astype(np.float32)
    y = X[:, :1] * 0.5 - X[:, 1:2] ** 2
    net = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    net.add(Dense(12, input_shape=(6,)))
    net.add(Activation("tanh"))
    net.add(Dense(1))
    tracemalloc.start()
    start = time.perf_counter()
    history = net.fit(X, y, n_epochs=epochs, batch_size=BATCH, shuffle=True, callbacks=list(callbacks))
    seconds, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    net.predict(X).persist_op("prediction")
    return history, seconds, peak


def record_counting_loop(steps):
    """w -> w + 1 for `steps` steps of one round (stoppable after any step); returns (seconds, peak bytes)."""
    tracemalloc.start()
    start = time.perf_counter()
    loop = Loop([R.t(torch.zeros(3))])
    with loop.step() as step:
        (w,) = step.carried
        step.carry([w + 1])
    [final] = loop.run([(0, steps)])
    seconds, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    final.persist_op("w")
    return seconds, peak


def test_a_fit_of_a_million_epochs_records_in_constant_time_and_memory():
    R.Graph(name="short", seed=7)
    _, _, short_peak = record_fit(10)
    graph = R.Graph(name="million", seed=7)
    history, seconds, peak = record_fit(10**6, [EarlyStopping(monitor="loss", patience=0, min_delta=1e9)])
    assert seconds < SECONDS and peak < PEAK_BYTES, (seconds, peak)
    assert peak < 2 * short_peak + 2**20   # the same as 10 epochs', not 10**5 times it
    # the names are all there, by rule
    assert len(history) == 10**6 and history[-1] == "training_loss_epoch_1000000_batch_1"
    assert "training_loss_epoch_1000000_batch_1" in graph.step_outputs
    assert "training_loss_epoch_1000001_batch_1" not in graph.step_outputs
    assert [rule[-1].startswith("early_stopping_") for rule in graph.step_outputs.rules()] == [False, True]
    # Activating it is still O(n) (one persisted entry per value per step: README, docs/reports/benchmarks.md), so
    # the run is shown on a fit of 10**4 epochs below, recorded by the same rules.


def test_a_fit_recorded_by_rules_runs_until_early_stopping_with_the_bits_of_a_short_fit(engine, module_workers):
    R.Graph(name="ten thousand", seed=7)
    history, _, _ = record_fit(10**4, [EarlyStopping(monitor="loss", patience=0, min_delta=1e9)])
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=600)
    # no improvement by 1e9 after the first epoch: EarlyStopping ends the loop after its second
    assert history.stopped_after == 2 and "EarlyStopping" in history.stop_reason
    assert len(history.batch_losses) == 2 and np.isfinite(history.batch_losses).all()
    # the bits of the same fit recorded two epochs long, evaluated in this process
    short = R.Graph(name="two epochs", seed=7)
    record_fit(2)
    expected = evaluate_persisted(short)
    assert history.batch_losses.tolist() == [float(expected[f"training_loss_epoch_{e}_batch_1"]) for e in (1, 2)]


def test_a_loop_of_a_billion_steps_records_in_constant_time_and_memory_and_runs_until_stopped(engine,
                                                                                                module_workers):
    R.Graph(name="ten steps")
    _, short_peak = record_counting_loop(10)
    R.Graph(name="a billion steps")
    seconds, peak = record_counting_loop(10**9)
    assert seconds < SECONDS and peak < PEAK_BYTES and peak < 2 * short_peak + 2**20, (seconds, peak)
    R.activate()
    R.execute()
    keys = engine.keys()
    wait_for(lambda: store_graphs.steps_done(engine.client, keys) >= 5, "five steps run")
    assert status.request_stop(engine.client, keys, "enough for the test", "test_record_constant")
    R.track_progress(progress_bar=False, timeout=120)
    steps = int(engine.client.hget(keys.meta, "stopped_step"))
    assert 5 <= steps < 10**9
    assert torch.equal(R.fetch_persisting_op("w"), torch.full((3,), float(steps)))   # w + 1, `steps` times


def test_run_names_index_their_runs_without_listing_them():
    names = RunNames(TRAINING_BATCH_RULE, range(1, 10**6 + 1), range(1, 4))
    assert len(names) == 3 * 10**6 and names[4] == "training_loss_epoch_2_batch_2"
    assert names[-1] == "training_loss_epoch_1000000_batch_3" and names[1:3] == ["training_loss_epoch_1_batch_2",
                                                                              "training_loss_epoch_1_batch_3"]
    assert names.index("training_loss_epoch_2_batch_2") == 4
    for absent in ("training_loss_epoch_2_batch_4", "training_loss_epoch_02_batch_2", "training_loss_epoch_0_batch_1",
                   "validation_loss_epoch_2", 7):
        assert absent not in names
    with pytest.raises(IndexError):
        names[3 * 10**6]
    assert list(RunNames(STEP_RULE, range(3, 5))) == ["training_loss_step_3", "training_loss_step_4"]
    assert RunNames(VALIDATION_RULE, range(1, 5)).overlaps(RunNames(VALIDATION_RULE, range(4, 9)))
    assert not RunNames(VALIDATION_RULE, range(1, 5)).overlaps(RunNames(VALIDATION_RULE, range(5, 9)))
    assert not RunNames(VALIDATION_RULE, range(1, 5)).overlaps(RunNames("early_stopping_0_epoch_{e}", range(1, 5)))
    with pytest.raises(ValueError, match="holds {e} once"):
        RunNames("loss_{k}", range(1, 3))
    with pytest.raises(ValueError, match="contiguous 1-based"):
        RunNames(VALIDATION_RULE, range(0, 3))


def test_a_rule_that_takes_a_name_already_used_is_refused():
    R.Graph(name="clash")
    R.t([1.0]).persist_op("validation_loss_epoch_3")
    loop = Loop([R.t(torch.zeros(1))])
    with pytest.raises(ValueError, match="validation_loss_epoch_3"):
        with loop.step() as step:
            (w,) = step.carried
            step.persist(w, RunNames(VALIDATION_RULE, range(1, 5)))
    loop = Loop([R.t(torch.zeros(1))])
    with loop.step() as step:
        (w,) = step.carried
        step.carry([w + 1])
        step.persist(w, RunNames(STEP_RULE, range(1, 5)))
        with pytest.raises(ValueError, match="already used"):
            step.persist(w + 2, RunNames(STEP_RULE, range(4, 6)))
        with pytest.raises(ValueError, match="already used"):
            step.persist(w + 3, ["training_loss_step_2"])
