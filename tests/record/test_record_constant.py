"""Recording and activating a training loop costs O(1) in its steps: `fit(n_epochs=10**6)` and a hand-written loop
of 10**9 steps record in a fraction of a second and a fixed memory (persist names by rule,
`ravop.core.loss_names.RunNames`; a loop's runs counted, not listed), the plan and the store hold the fit's 2
million loss names as a few rules (`ravop.core.persist_rules`), and both run: the fit until EarlyStopping ends it,
its History and R.fetch_losses reading the 2 epochs it ran, its losses fetched by name through the rule; the loop
until a stop request does; on a real server and worker processes, with the values of the same loop recorded that
short. Timings are bench_record.py's (`--activation`), not this file's."""
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
from ravop.core.errors import GraphStateError, NotComputedError, UnknownPersistName
from ravop.core.loss_names import STEP_RULE, TRAINING_BATCH_RULE, VALIDATION_RULE, RunNames
from ravop.core.persist_rules import PersistedIds, PersistRule
from ravop.record.loop import Loop
from ravop.runtime.evaluate import evaluate_persisted
from ravop.client import training_losses
from ravop.store import GraphKeys, flush, loss_reads, small_values
from ravop.store import graphs as store_graphs
from ravop.tools import status
from ravop.wire.codec import encode_tensor

from helpers import wait_for

ROWS, BATCH = 16, 16   # 1 step an epoch: 2 million persisted names (a loss and an EarlyStopping decision an epoch)
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


def test_a_fit_of_a_million_epochs_activates_by_rule_and_runs_until_early_stopping_with_the_bits_of_a_short_fit(
        engine, module_workers):
    graph = R.Graph(name="million", seed=7)
    history, _, _ = record_fit(10**6, [EarlyStopping(monitor="loss", patience=0, min_delta=1e9)])
    tracemalloc.start()
    R.activate()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # about 13 MiB, the compiler's first imports; 2 million names listed took about 600 MiB (bench_record.py)
    assert peak < 8 * PEAK_BYTES, peak
    keys = engine.keys()
    # the store holds the trained values' names and two rules, not an entry per epoch
    rules = [PersistRule.decode(r) for r in engine.client.hvals(keys.persist_rules)]
    assert engine.client.hlen(keys.persist) < 20 and [len(rule.names) for rule in rules] == [10**6, 10**6]
    assert rules[0].names.template == TRAINING_BATCH_RULE and rules[0].id_of("training_loss_epoch_3_batch_1") == \
        rules[0].first_id + 2
    with pytest.raises(NotComputedError):   # named by the rule, not computed yet
        R.fetch_persisting_op("training_loss_epoch_1_batch_1")
    R.execute()
    R.track_progress(progress_bar=False, timeout=600)
    # no improvement by 1e9 after the first epoch: EarlyStopping ends the loop after its second
    assert history.stopped_after == 2 and "EarlyStopping" in history.stop_reason
    assert len(history.batch_losses) == 2 and np.isfinite(history.batch_losses).all()
    losses = R.fetch_losses()
    assert losses.batch.tolist() == history.batch_losses.tolist() and losses.stopped_step == 2
    assert R.fetch_persisting_op("training_loss_epoch_2_batch_1").item() == history.batch_losses[1]
    with pytest.raises(GraphStateError, match="is done but 'training_loss_epoch_3_batch_1' is not"):
        R.fetch_persisting_op("training_loss_epoch_3_batch_1")   # the rule names it; the loop stopped before it
    # the bits of the same fit recorded two epochs long, evaluated in this process
    short = R.Graph(name="two epochs", seed=7)
    record_fit(2)
    expected = evaluate_persisted(short)
    assert history.batch_losses.tolist() == [float(expected[f"training_loss_epoch_{e}_batch_1"]) for e in (1, 2)]
    # read back from the store's rules, not from what this session's activation kept (the graph named, not current)
    R.activate()
    assert R.fetch_persisting_op("training_loss_epoch_2_batch_1", graph=graph.id).item() == history.batch_losses[1]
    with pytest.raises(UnknownPersistName, match="names: .*'training_loss_epoch_{e}_batch_{b}' for epochs range"):
        R.fetch_persisting_op("training_loss_epoch_1000001_batch_1", graph=graph.id)
    # the reads without a script (a user refused them) give the scripts' answers: the rules walked as far as stored
    client = engine.client
    scripted = client.register_script(loss_reads.READ_LOSSES)(
        keys=[keys.meta, keys.persist, keys.persist_rules],
        args=[keys.tensor_prefix, "training_loss_", "validation_loss_"])
    assert scripted == loss_reads._read_losses_unscripted(client, keys) and len(scripted) == 2 + 2 + 2
    scripted = client.register_script(small_values.READ_SMALL)(
        keys=[keys.meta, keys.persist, keys.persist_rules], args=[keys.tensor_prefix, 4096, "done"])
    assert scripted == small_values._read_small_unscripted(client, keys, 4096)
    # R.flush finds more than NAMED_RULE_RUNS values by rule too many to name: it SCANs
    assert flush.owned_keys(client, engine.token) is None


def test_a_short_fit_by_rule_is_flushed_by_name(engine, module_workers):
    R.Graph(name="three epochs", seed=7)
    record_fit(3)
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    keys = engine.keys()
    slots, _ = flush.owned_keys(engine.client, engine.token)
    [rule] = [PersistRule.decode(r) for r in engine.client.hvals(keys.persist_rules)]
    named = {key for slot in slots for key in slot}
    assert {keys.tensor(rule.first_id + k) for k in range(3)} <= named and keys.persist_rules in named
    assert engine.client.exists(*(keys.tensor(rule.first_id + k) for k in range(3))) == 3
    R.flush()
    assert not engine.client.exists(keys.persist_rules, keys.tensor(rule.first_id))


def test_persisted_ids_match_names_against_rules_and_rules_survive_the_store():
    rule = PersistRule(RunNames(TRAINING_BATCH_RULE, range(1, 10**6 + 1), range(1, 4)), 100)
    assert PersistRule.decode(rule.encode()).encode() == PersistRule.decode(rule.encode().encode()).encode() == \
        rule.encode() == "100 1 1000000 1 3 training_loss_epoch_{e}_batch_{b}"
    ids = PersistedIds({"prediction": 7}, [rule])
    assert ids["prediction"] == 7 and ids["training_loss_epoch_2_batch_1"] == 103 and ids.get("other") is None
    assert "training_loss_epoch_1000000_batch_3" in ids and "training_loss_epoch_1000000_batch_4" not in ids
    assert len(ids) == 3 * 10**6 + 1 and ids   # counted, not listed
    with pytest.raises(ValueError, match="is not a persist rule"):
        PersistRule.decode("7 1 2 training_loss_epoch_{e}")
    with pytest.raises(ValueError, match="holds {e} once"):
        PersistRule.decode("7 1 2 1 1 loss_{k}")


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


def test_losses_by_rule_equal_the_same_losses_listed_by_name():
    """A running fit's losses read by rule (full batches, the short last batch and validation: three rules, the
    values of their first runs) give the arrays the same names listed one by one give (NaN where not computed)."""
    full = PersistRule(RunNames(TRAINING_BATCH_RULE, range(1, 5), range(1, 3)), 100)    # 4 epochs of 2 full batches
    short = PersistRule(RunNames(TRAINING_BATCH_RULE, range(1, 5), range(3, 4)), 200)   # and a short third
    validation = PersistRule(RunNames(VALIDATION_RULE, range(1, 5)), 300)
    walked = [(full, [encode_tensor(torch.tensor(float(k))) for k in range(5)]),   # epochs 1, 2 and one of 3
              (short, [encode_tensor(torch.tensor(10.0 + k)) for k in range(2)]),
              (validation, [encode_tensor(torch.tensor(20.0))])]
    listed = {name: None for rule, _ in walked for name in rule.names}
    listed.update((rule.names[k], value) for rule, values in walked for k, value in enumerate(values))
    keys = GraphKeys("t", "g")
    by_rule = training_losses.losses_of(None, keys, "running", {}, walked)
    by_name = training_losses.losses_of(None, keys, "running", listed)
    assert np.array_equal(by_rule.batch, by_name.batch, equal_nan=True) and len(by_rule.batch) == 12
    assert by_rule.batch[:6].tolist() == [0, 1, 10, 2, 3, 11]   # epoch-major: each epoch's short batch last
    for field in ("epoch", "batch_stored", "validation_stored"):
        assert getattr(by_rule, field).tolist() == getattr(by_name, field).tolist(), field
    assert np.array_equal(by_rule.validation, by_name.validation, equal_nan=True) and by_rule.validation[0] == 20
    before = training_losses.losses_of(None, keys, "activated", {}, walked)   # before the start: nothing shown
    assert np.isnan(before.batch).all() and len(before.batch) == 12 and not before.batch_stored.any()
