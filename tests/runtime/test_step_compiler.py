"""The step compiler (ravop/runtime/step_compiler.py): a compiled step template gives the plain step's bits (on the
workers too), its decision is measured and kept per template and machine, and a template that fails to compile
runs op by op with the reason logged."""
import json
import logging

import numpy as np
import pytest
import torch

import ravop as R
from helpers import on_one_thread
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import (Activation, BatchNormalization2D, Conv2D, Dense, Dropout, Flatten,
                             MaxPooling2D)
from ravdl.v2.optimizers import Adam, AdamW, RMSprop
from ravop.core import registry
from ravop.runtime import loop_run, step_compiler
from ravop.runtime.evaluate import evaluate, evaluate_persisted
from ravop.runtime.runner import OpError
from worker.loops import step_decisions

RNG = np.random.default_rng(4)
IMAGES = RNG.normal(size=(72, 1, 8, 8)).astype(np.float32)
LABELS = RNG.integers(0, 10, 72)


def record_cnn(name, epochs=3):
    """A small CNN with every rewrite's op: conv, relu (ties at 0 in max pooling), max pooling, dropout, batch
    norm, Adam; 72 rows in batches of 16: two templates (full batches and the last, of 8)."""
    graph = R.Graph(name=name, seed=3)
    model = NeuralNetwork(optimizer=Adam(lr=0.01), loss="CrossEntropy")
    for layer in (Conv2D(1, 4, 3, padding="same", input_shape=(1, 8, 8)), Activation("relu"), MaxPooling2D(2),
                  Dropout(0.2), BatchNormalization2D(4), Flatten(), Dense(16), Activation("relu"), Dropout(0.3),
                  Dense(10), Activation("softmax")):
        model.add(layer)
    names = list(model.fit(IMAGES, LABELS, n_epochs=epochs, batch_size=16, shuffle=True))
    model.predict(IMAGES).persist_op("prediction")
    return graph, names + ["prediction"]


def reference(graph, names, monkeypatch):
    """The persisted values of `graph` computed op by op in this process."""
    with monkeypatch.context() as patch:
        patch.setenv(step_compiler.DISABLE_ENV, "off")
        return on_one_thread(evaluate_persisted, graph, names)


def always(compiled):
    """Decisions that say `compiled` for every template (no trial runs)."""
    decisions = step_compiler.MemoryDecisions()
    decisions.load = lambda key: {"compiled": float(compiled)}
    return decisions


def tuned_run(monkeypatch, graph, names, decisions):
    """(the persisted values computed in this process, the `Tuned` choosers its steps got from `decisions`)."""
    made = []
    real_tune = step_compiler.tune
    monkeypatch.setattr(step_compiler, "tune", lambda runner, nodes, inputs, _, *rest: made.append(
        real_tune(runner, nodes, inputs, decisions, *rest)) or made[-1])
    return on_one_thread(evaluate_persisted, graph, names), made


def test_the_compiled_step_gives_the_plain_steps_bits_in_process(monkeypatch):
    graph, names = record_cnn("compiled in process")
    plain = reference(graph, names, monkeypatch)
    compiled, made = tuned_run(monkeypatch, graph, names, always(True))
    rewrites = [tuned.compiled.rewrites for tuned in made]
    assert len(rewrites) == 2 and all(r["optimizer_groups"] == 1 and r["dropout_masks_kept"] == 2 and
                                       r["channels_last_pools"] == 1 and r["batch_norm_stats_kept"] == 1 and
                                       r["projections"] for r in rewrites), rewrites
    assert all(tuned.decided for tuned in made)
    for name in names:
        assert torch.equal(compiled[name], plain[name]), name


def test_a_dropout_whose_forward_draws_nothing_leaves_its_backward_as_recorded(monkeypatch):
    """p=1 zeroes without drawing a mask: the backward's kept-mask rewrite falls back to the op, its seed worked
    out per run as the plain step does."""
    graph = R.Graph(name="dropout everything", seed=2)
    model = NeuralNetwork(optimizer=Adam(lr=0.01), loss="CrossEntropy")
    for layer in (Dense(16, input_shape=(64,)), Dropout(1.0), Dense(10), Activation("softmax")):
        model.add(layer)
    names = list(model.fit(IMAGES.reshape(72, 64), LABELS, n_epochs=2, batch_size=16, shuffle=True))
    plain = reference(graph, names, monkeypatch)
    compiled, made = tuned_run(monkeypatch, graph, names, always(True))
    assert made and all(tuned.compiled.rewrites["dropout_masks_kept"] == 1 for tuned in made)
    for name in names:
        assert torch.equal(compiled[name], plain[name]), name


@pytest.mark.parametrize("optimizer", [AdamW(lr=0.01, weight_decay=0.1),
                                       RMSprop(lr=0.01, momentum=0.9, centered=True, weight_decay=0.01)])
def test_other_optimizers_compile_to_the_same_bits(optimizer, monkeypatch):
    graph = R.Graph(name="optimizers", seed=5)
    model = NeuralNetwork(optimizer=optimizer, loss="CrossEntropy")
    for layer in (Dense(32, input_shape=(64,)), Activation("relu"), Dense(10), Activation("softmax")):
        model.add(layer)
    names = list(model.fit(IMAGES.reshape(72, 64), LABELS, n_epochs=2, batch_size=16, shuffle=True))
    model.predict(IMAGES.reshape(72, 64)).persist_op("prediction")
    names.append("prediction")
    plain = reference(graph, names, monkeypatch)
    compiled, made = tuned_run(monkeypatch, graph, names, always(True))
    assert all(tuned.compiled.rewrites["optimizer_groups"] == 1 for tuned in made) and made
    for name in names:
        assert torch.equal(compiled[name], plain[name]), name


@pytest.mark.parametrize("op, settings", [
    ("adam_step", {"lr": 0.01}),
    ("adam_step", {"lr": 0.003, "weight_decay": 0.1, "maximize": True, "beta1": 0.8}),
    ("adamw_step", {"lr": 0.01, "weight_decay": 0.05}),
    ("adam_step", {"lr": 0.01, "lr_schedule": {"kind": "step", "step_size": 2, "gamma": 0.5}}),
    ("rmsprop_step", {"lr": 0.01}),
    ("rmsprop_step", {"lr": 0.01, "momentum": 0.9, "centered": True, "weight_decay": 0.01, "maximize": True}),
    ("rmsprop_step", {"lr": 0.02, "momentum": 0.5, "lr_schedule": {"kind": "exponential", "gamma": 0.9}}),
])
def test_a_foreach_update_is_bitwise_the_per_parameter_loop(op, settings):
    """The grouped kernel against the op's own kernel (Adam's in-place one), parameter by parameter, 5 steps."""
    torch.manual_seed(0)
    shapes = [(16, 1, 3, 3), (16,), (10, 64), (10,), (3, 5, 7)]
    state = [[torch.randn(s), torch.rand(s) + 1, torch.rand(s), torch.rand(s)] for s in shapes]
    loop, grouped = [[t.clone() for t in one] for one in state], [[t.clone() for t in one] for one in state]
    opdef = registry.REGISTRY[op]
    kernel = opdef.kernel if opdef.in_place is None else opdef.in_place.kernel
    group = step_compiler._Group(opdef.group_update.kernel, len(shapes))   # the op's declared group update
    for step in range(1, 6):
        grads = [torch.randn(s) for s in shapes]
        loop = [list(kernel(p, g, a, b, c, step=step, **settings)) for (p, a, b, c), g in zip(loop, grads)]
        group(*[t for (p, a, b, c), g in zip(grouped, grads) for t in (p, g, a, b, c)], step=step, **settings)
        grouped = [list(result) for result in group.box]
    for a, b in zip(loop, grouped):
        for x, y in zip(a, b):
            assert torch.equal(x.view(torch.int32), y.view(torch.int32))   # the bits, NaN's included


@pytest.mark.parametrize("y_true, y_pred, params", [
    (torch.tensor([3, 0, 9, 9]), torch.randn(4, 10), {}),
    (torch.tensor([3, 0, 9, 1]), torch.randn(4, 10), {"ignore_index": 9}),
    (torch.tensor(2), torch.randn(5), {}),
    (torch.tensor([[1, 2], [0, 4]]), torch.randn(4, 5), {"reshape_label": (4,)}),
    (torch.softmax(torch.randn(4, 10), 1), torch.randn(4, 10), {}),        # probabilities: as the op
    (torch.tensor([[1, 2], [0, 4]]), torch.randn(2, 5, 2), {}),            # (N, C, d): as the op
])
def test_a_cross_entropy_backward_reusing_its_forward_is_bitwise_the_op(y_true, y_pred, params):
    reuses = registry.REGISTRY["cross_entropy_loss_backward"].reuses   # the op's declared reuse of its forward
    box = [None]
    forward = reuses.keeping(box, y_true, y_pred, **params)
    assert torch.equal(forward.view(torch.int32), registry.REGISTRY["cross_entropy_loss"].kernel(
        y_true, y_pred, **params).view(torch.int32))
    g = torch.tensor(0.7)
    for mask in ((False, True), (True, True)) if y_true.is_floating_point() else ((False, True),):
        kept = reuses.kept(box, g, y_true, y_pred, **params, mask=mask)
        recomputed = registry.REGISTRY["cross_entropy_loss_backward"].kernel(g, y_true, y_pred, **params, mask=mask)
        for a, b in zip(kept, recomputed):
            assert (a is None and b is None) or torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_the_rule_table_covers_every_declaration():
    """Each kind of declaration has its rule; a backward names a registered forward that is another op."""
    assert set(step_compiler.DECLARED) <= set(step_compiler.RULES)
    declared = [d for d in registry.unique_opdefs() if any(getattr(d, f) is not None for f in step_compiler.DECLARED)]
    assert {d.name for d in declared} >= {"adam_step", "adamw_step", "rmsprop_step", "dropout_backward",
                                          "batch_norm_backward", "cross_entropy_loss_backward", "max_pool2d",
                                          "torchscript_vjp"}
    for opdef in declared:
        if opdef.reuses is not None:
            assert registry.get(opdef.reuses.forward) is not opdef
    assert set(step_compiler.rewrite_names()) == {"optimizer_groups", "dropout_masks_kept", "batch_norm_stats_kept",
                                                  "log_softmax_kept", "channels_last_pools", "projections",
                                                  "torchscript_graphs_kept"}


@pytest.mark.parametrize("shape, params", [((2, 3, 8, 8), {"kernel_size": 2, "return_indices": True}),
                                           ((2, 3, 9, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
                                           ((3, 8, 8), {"kernel_size": 2, "return_indices": True})])
def test_a_cpu_variant_is_bitwise_the_op(shape, params):
    """max_pool2d on a channels-last copy: the same maxima and the same (first-in-window) indices, ties included."""
    x = torch.relu(torch.randn(shape))   # zeros: ties in most windows
    opdef = registry.REGISTRY["max_pool2d"]
    got, want = opdef.cpu_variant.kernel(x, **params), opdef.kernel(x, **params)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert a.is_contiguous() and torch.equal(a, b)


def test_the_decision_is_measured_then_kept_for_the_template(monkeypatch):
    decisions = step_compiler.MemoryDecisions()
    graph, names = record_cnn("decided", epochs=8)   # 32 runs of the full batch's template
    _, made = tuned_run(monkeypatch, graph, names, decisions)
    full = made[0]
    assert full.decided is not None
    kept = decisions.load(full.key)
    assert kept["compiled"] == float(full.decided) and kept["plain_us"] > 0 and kept["compiled_us"] > 0
    assert len(full.times[True]) == len(full.times[False]) == step_compiler.TRIAL_RUNS
    _, made = tuned_run(monkeypatch, *record_cnn("again", epochs=1), decisions)
    assert made[0].key == full.key and made[0].decided == full.decided and not made[0].times[True]


def test_a_template_run_too_few_times_to_measure_runs_compiled_undecided(monkeypatch):
    """The CNN's last, short batch runs once an epoch: 8 runs cannot be timed against each other, so it runs
    compiled (the same bits) with nothing measured or kept; the full batch's 32 runs are measured."""
    decisions = step_compiler.MemoryDecisions()
    graph, names = record_cnn("short template", epochs=8)
    plain = reference(graph, names, monkeypatch)
    got, made = tuned_run(monkeypatch, graph, names, decisions)
    full, short = made
    assert short.decided is True and not short.times[True] and not short.times[False]
    assert short.runner.calls is short.compiled.calls and decisions.load(short.key) is None
    assert len(full.times[True]) == step_compiler.TRIAL_RUNS and decisions.load(full.key) is not None
    for name in names:
        assert torch.equal(got[name], plain[name]), name


def test_a_template_that_fails_to_compile_runs_op_by_op_and_says_why(monkeypatch, caplog):
    graph, names = record_cnn("broken rewrite", epochs=1)
    plain = reference(graph, names, monkeypatch)

    def broken(*args):
        raise RuntimeError("a rewrite that cannot handle this template")
    monkeypatch.setitem(step_compiler.RULES, "reuses", broken)
    with caplog.at_level(logging.WARNING, logger="ravop.runtime.step_compiler"):
        got = on_one_thread(evaluate_persisted, graph, names)
    assert "not compiled, running op by op: RuntimeError: a rewrite that cannot handle this template" in caplog.text
    for name in names:
        assert torch.equal(got[name], plain[name]), name


def test_off_in_the_environment_runs_every_step_plain(monkeypatch):
    made = []
    real_tune = step_compiler.tune
    monkeypatch.setattr(step_compiler, "tune", lambda *a: made.append(real_tune(*a)) or made[-1])
    monkeypatch.setenv(step_compiler.DISABLE_ENV, "off")
    graph, names = record_cnn("off", epochs=1)
    on_one_thread(evaluate_persisted, graph, names[:1])
    assert made == [None, None]


def test_the_digest_names_the_model_not_the_ids():
    graph_a, _ = record_cnn("a", epochs=1)
    graph_b, _ = record_cnn("b", epochs=1)
    (record_a,), (record_b,) = graph_a.loops.values(), graph_b.loops.values()
    digests = []
    for record in (record_a, record_b):
        template = record.spec.templates[0]
        digests.append(step_compiler.template_digest(template.nodes, [*record.spec.outer_ids,
                                                                      *template.hole_ids()], "cpu"))
    assert digests[0] == digests[1]
    other = record_a.spec.templates[1]   # the last batch: other shapes
    assert step_compiler.template_digest(other.nodes, [*record_a.spec.outer_ids, *other.hole_ids()],
                                         "cpu") != digests[0]


def test_a_workers_decisions_are_kept_in_its_calibration_cache(tmp_path):
    path = tmp_path / "calibration.json"
    kept = step_decisions.CachedDecisions("cpu", str(path))
    assert kept.load("abc") is None
    kept.store("abc", {"compiled": 1.0, "plain_us": 200.0, "compiled_us": 150.0})
    again = step_decisions.CachedDecisions("cpu", str(path))
    assert again.load("abc") == {"compiled": 1.0}
    entries = json.loads(path.read_text())
    (key,) = entries
    assert json.loads(key)["step"] == "abc" and json.loads(key)["machine"]["device"] == "cpu"


def test_a_worker_reads_the_cache_file_once_per_template(tmp_path, monkeypatch):
    """A template the file does not have (one run too few times to be decided) is not looked up again at every
    loop: the file is parsed once per digest and process."""
    kept = step_decisions.CachedDecisions("cpu", str(tmp_path / "calibration.json"))
    reads = []
    real = step_decisions.calibration_cache.load
    monkeypatch.setattr(step_decisions.calibration_cache, "load", lambda *a: reads.append(a) or real(*a))
    assert [kept.load("rare") for _ in range(3)] == [None] * 3 and len(reads) == 1
    kept.store("rare", {"compiled": 0.0})
    assert kept.load("rare") == {"compiled": 0.0} and len(reads) == 1


def test_workers_compiled_or_not_give_the_same_bits_and_keep_their_decision(engine, workers, monkeypatch,
                                                                             tmp_path):
    cache = tmp_path / "calibration.json"
    monkeypatch.setenv("RAVOP_CALIBRATION_CACHE", str(cache))   # the workers inherit it
    graph, names = record_cnn("compiled on a worker", epochs=8)
    want = reference(graph, names, monkeypatch)
    results = {}
    for setting in ("off", "on"):
        monkeypatch.setenv(step_compiler.DISABLE_ENV, setting)
        (name,) = workers.start(1)
        R.flush()
        graph, names = record_cnn(f"compiled {setting}", epochs=8)
        R.activate()
        R.execute()
        R.track_progress(timeout=300, progress_bar=False)
        results[setting] = {n: R.fetch_persisting_op(n) for n in names}
        workers.terminate(name)
    for setting, got in results.items():
        for n in names:
            assert torch.equal(got[n], want[n]), (setting, n)
    steps = [json.loads(key) for key in json.loads(cache.read_text()) if "step" in json.loads(key)]
    assert steps, "the compiling worker kept no decision"
    figures = json.loads(cache.read_text())
    for key, value in figures.items():
        if "step" in json.loads(key):
            assert value["compiled"] in (0.0, 1.0) and value["plain_us"] > 0 and value["optimizer_groups"] == 1


def test_a_traced_step_runs_op_by_op(monkeypatch):
    """Hooks that wrap a step's calls (dispute traces, the test liar) see the plain calls."""
    from worker.verify.dispute_trace import wrap_calls
    graph, names = record_cnn("traced", epochs=1)
    (record,) = graph.loops.values()
    captured = []
    real_init = loop_run.LoopRun.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        captured.append(self)
    monkeypatch.setattr(loop_run.LoopRun, "__init__", init)
    on_one_thread(evaluate_persisted, graph, names[:1])
    run = captured[0]
    seen = []
    wrap_calls(run, lambda t, i, value: seen.append((t, i)) or value)
    with torch.no_grad():
        run.run()
    assert all(step.tuned is not None and step.tuned.decided is False for step in run.steps)
    runs = [record.spec.runs(t) for t in range(len(run.steps))]
    assert len(seen) == sum(n * len(step.runner.calls) for n, step in zip(runs, run.steps))



def recorded_loop(name):
    """(spec, evaluated inputs, seed) of `record_cnn`'s one training loop (1 epoch: two templates)."""
    graph, _ = record_cnn(name, epochs=1)
    ((loop_id, record),) = graph.loops.items()
    return record.spec, evaluate(list(graph.nodes[loop_id].inputs)), graph.seed


def test_projections_are_folded_into_the_op_that_makes_their_tuple():
    loop = recorded_loop("folded")
    run = loop_run.LoopRun(*loop, decisions=always(True))
    for step in run.steps:
        plan, calls = step.tuned.compiled.plan, step.runner.calls
        spread = [r for entry in plan for _, _, r in entry[2]]
        assert spread and all(step.runner.nodes[r].op == "tuple_get" for r in spread)
        # every call has one place: its own entry, or its tuple's after the op that makes the tuple
        assert sorted([entry[0] for entry in plan] + spread) == list(range(len(calls)))
        assert all(r > entry[0] for entry in plan for _, _, r in entry[2])
    with torch.no_grad():
        folded, op_by_op = run.run(), loop_run.LoopRun(*loop, decisions=always(False)).run()
    assert len(folded) == len(op_by_op) and all(torch.equal(a, b) for a, b in zip(folded, op_by_op))


class RefuseOne:
    """A memory watcher (ravop.runtime.runner.Watcher) refusing the output of op `refused` of a template's runner."""

    def __init__(self, n_calls, refused):
        self.limits = [2**62] * n_calls
        if refused is not None:
            self.limits[refused] = 0
        self.refused = refused

    def problem(self, index, value):
        return f"refused output of op {index}" if index == self.refused else None


def a_folded_projection(loop):
    """(the first template, the index of the last projection folded into an op of its compiled plan)."""
    step = loop_run.LoopRun(*loop, decisions=always(True)).steps[0]
    return loop[0].templates[0], next(e for e in step.tuned.compiled.plan if e[2])[2][-1][2]


@pytest.mark.parametrize("compiled", [False, True])
def test_a_folded_projection_keeps_its_memory_check(compiled):
    """The watcher's limit of a projection folded into its tuple's op still applies and the error names the
    projection, as when it runs as its own call."""
    loop = recorded_loop("refused")
    first, refused = a_folded_projection(loop)
    run = loop_run.LoopRun(*loop, watch=lambda t: RefuseOne(len(t.nodes), refused if t is first else None),
                           decisions=always(compiled))
    with torch.no_grad(), pytest.raises(OpError) as caught:
        run.run()
    assert caught.value.over_budget and caught.value.detail == f"refused output of op {refused}"
    assert caught.value.node is run.steps[0].runner.nodes[refused]
    assert caught.value.node.op == "tuple_get"


@pytest.mark.parametrize("compiled", [False, True])
def test_a_failing_folded_projection_is_named_in_its_error(compiled, monkeypatch):
    """A projection that raises (here: an index past its tuple) fails naming the projection, folded or not."""
    loop = recorded_loop("failing")
    first, failing = a_folded_projection(loop)
    monkeypatch.setitem(first.nodes[failing].params, "index", 99)   # compiled: operator.itemgetter(99)
    run = loop_run.LoopRun(*loop, decisions=always(compiled))
    with torch.no_grad(), pytest.raises(OpError) as caught:
        run.run()
    assert caught.value.node is run.steps[0].runner.nodes[failing]
    assert "IndexError" in caught.value.detail and isinstance(caught.value.__cause__, IndexError)
