"""The reproducible numerics mode (`ravop-worker --numerics reproducible`): every op it covers gives the same bits
on three emulated x86 CPU classes and on 1 and 2 threads, fits of the digits MLP and CNN on workers of different
classes give the same losses and weights, and an op it does not cover is refused (in process and by a worker: the
graph fails naming it), never run the default way.

CPU classes are emulated by the variables torch's libraries read when they load (so each run is a fresh process
with them set): avx2 is this machine untouched; avx and sse4 pin ATen's vector code, MKL's code path and oneDNN's
ISA lower. The default kernels' bits do differ between these runs (asserted too: otherwise the emulation, not the
mode, would make them agree).
"""
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

import ravop as R
from ravop.core import numerics_mode
from ravop.core.errors import PlanError
from ravop.local.embedded import start_worker, worker_environment
from ravop.record.graph import current_graph
from ravop.runtime.evaluate import evaluate
from ravop.runtime.loop_run import LoopRun
from ravop.store.keys import worker_key

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples"))

import bench_contention  # noqa: E402
import bench_ravdl  # noqa: E402
import bench_step  # noqa: E402
import reproducible_probe  # noqa: E402
from example_data import digits_data  # noqa: E402

CLASSES = {"avx2": {},
           "avx": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AVX", "ONEDNN_MAX_CPU_ISA": "AVX"},
           "sse4": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}}
RUNS = [(name, threads) for name in CLASSES for threads in (1, 2)]
# Default kernels measured to differ between the classes or thread counts (issue 42): the emulation is live.
DIFFER_BY_DEFAULT = ("matmul-large", "linear_backward-large", "conv2d-large", "conv2d_backward-large", "sum-full",
                     "softmax_backward-64x10", "cross_entropy_loss_backward-64x10", "layer_norm_backward-wide",
                     "adam_step-large")
CLOSE = 1e-5   # the mode's values against the default kernels', relative to the largest magnitude


def class_environment(name):
    env = {k: v for k, v in worker_environment().items() if k not in CLASSES["sse4"]}
    return {**env, **CLASSES[name], numerics_mode.ENV: numerics_mode.REPRODUCIBLE}


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """(run -> the probe's JSON) for every class and thread count, on inputs drawn once here."""
    inputs = str(tmp_path_factory.mktemp("probe") / "inputs.npz")
    reproducible_probe.write_inputs(inputs)
    results = {}
    for name, threads in RUNS:
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "reproducible_probe.py"), inputs,
                               str(threads)], env=class_environment(name), capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        results[(name, threads)] = json.loads(done.stdout)
    return results


def test_the_probes_ran_as_each_class(probes):
    assert probes[("avx", 1)]["_class"]["capability"] == "DEFAULT"
    assert probes[("sse4", 2)]["_class"] == {"threads": 2, "capability": "DEFAULT", "mkl_cbwr": "COMPATIBLE",
                                             "onednn": "SSE41"}


def test_every_covered_op_gives_the_same_bits_on_every_class_and_thread_count(probes):
    first = probes[RUNS[0]]
    cases = [case for case in first if case != "_class"]
    assert len(cases) > 450
    errors = {case: first[case]["error"] for case in cases if "error" in first[case]}
    assert not errors, f"covered ops whose mode kernel raised on a sample: {errors}"
    differ = {case: {run: probes[run][case]["mode"] for run in RUNS} for case in cases
              if len({probes[run][case]["mode"] for run in RUNS}) > 1}
    assert not differ, f"mode kernels whose bits differ by class or threads: {differ}"
    unlike = [case for case in cases if not first[case]["like"]]
    assert not unlike, f"mode kernels giving other dtypes or shapes than the op's: {unlike}"
    far = {case: first[case]["gap"] for case in cases if first[case]["gap"] > CLOSE}
    assert not far, f"mode kernels far from the default kernels' values: {far}"


def test_the_default_kernels_do_differ_between_these_runs(probes):
    same = [case for case in DIFFER_BY_DEFAULT if len({probes[run][case]["default"] for run in RUNS}) == 1]
    assert not same, f"default kernels that agree on every run (is the emulation live?): {same}"


def test_an_op_without_a_reproducible_kernel_is_refused(monkeypatch):
    R.Graph(name="refused")
    x = R.t(np.arange(1.0, 5.0))
    monkeypatch.setenv(numerics_mode.ENV, numerics_mode.REPRODUCIBLE)
    with pytest.raises(PlanError, match="op 'prod' has no kernel in the reproducible numerics mode"):
        evaluate([R.prod(x)])
    assert float(evaluate([R.sum(x)])[0]) == 10.0   # a covered op runs
    monkeypatch.setenv(numerics_mode.ENV, "exact")
    with pytest.raises(ValueError, match="RAVOP_NUMERICS='exact': must be one of default, reproducible"):
        evaluate([R.sum(x)])


def test_the_step_compiler_keeps_the_mode_kernels(monkeypatch):
    """A compiled step rewrites only ops whose mode kernel is their own (dropout masks kept, pooling channels-last):
    none of the default kernels' batch-norm statistics, log-softmax or grouped Adam come back in."""
    X, _, y, _ = digits_data()
    monkeypatch.setenv(numerics_mode.ENV, numerics_mode.REPRODUCIBLE)
    spec, inputs, seed = bench_step.recorded_loop(lambda: bench_contention.record_cnn(1, 32, X[:128], y[:128]))
    plain = LoopRun(spec, inputs, seed, decisions=None)
    compiled = LoopRun(spec, inputs, seed, decisions=bench_step.Always())
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(plain.run(), compiled.run()))
    rewrites = compiled.steps[0].tuned.compiled.rewrites
    assert rewrites["dropout_masks_kept"] and rewrites["channels_last_pools"]
    assert rewrites["batch_norm_stats_kept"] == rewrites["log_softmax_kept"] == rewrites["optimizer_groups"] == 0


def _start(url, name, threads, log_dir):
    worker = f"repro-{name}-{threads}-{uuid.uuid4().hex[:4]}"
    previous = dict(os.environ)
    os.environ.clear()
    os.environ.update(class_environment(name))   # start_worker gives the worker this process's environment
    try:
        proc = start_worker(url, worker, "cpu", threads=threads, log_path=str(log_dir / f"{worker}.log"),
                            extra_args=["--numerics", numerics_mode.REPRODUCIBLE])
    finally:
        os.environ.clear()
        os.environ.update(previous)
    return worker, proc


def _fit(record, graph_name):
    """Losses (every step) and trained weights of one fit through the engine."""
    R.flush()
    R.Graph(name=graph_name, seed=0)
    model = record()
    model.persist_weights()
    names = bench_ravdl.loss_names(current_graph())
    weights = sorted(f"{layer}.{key}" for layer, leaf in model.leaf_layers() for key in leaf.state())
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    return ([R.fetch_persisting_op(n) for n in names], [R.fetch_persisting_op(n) for n in weights])


def _assert_the_worker_refuses_an_uncovered_op():
    R.flush()
    R.Graph(name="repro-refused")
    (R.prod(R.random(size=(10, 10)), axis=1) + 1.0).persist_op("product")   # random: not folded, the worker runs it
    R.activate()
    R.execute()
    with pytest.raises(R.GraphFailedError, match="op 'prod' has no kernel in the reproducible numerics mode"):
        R.track_progress(progress_bar=False, timeout=120)


def test_fits_on_workers_of_different_classes_give_the_same_losses_and_weights(server, client, tmp_path):
    X, _, y, _ = digits_data()
    models = {"mlp": lambda: bench_contention.record_mlp(2, 32, X, y),
              "cnn": lambda: bench_contention.record_cnn(1, 32, X, y)}
    R.initialize(token=f"repro-{uuid.uuid4().hex[:6]}", redis_url=server.url)
    results = {}
    for name, threads in (("avx2", 1), ("avx", 2), ("sse4", 1)):
        worker, proc = _start(server.url, name, threads, tmp_path)
        try:
            deadline = time.monotonic() + 120
            while not client.exists(worker_key(worker)):
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / f"{worker}.log").read_text()
                time.sleep(0.05)
            for model, record in models.items():
                results[(name, model)] = _fit(record, f"repro-{model}-{name}")
            if name == "avx2":
                _assert_the_worker_refuses_an_uncovered_op()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        assert "reproducible numerics" in (tmp_path / f"{worker}.log").read_text()
    for model in models:
        losses, weights = results[("avx2", model)]
        assert len(losses) > 30 and weights
        assert float(losses[-1]) < float(losses[0])   # it trains
        for name in ("avx", "sse4"):
            other_losses, other_weights = results[(name, model)]
            assert all(torch.equal(a, b) for a, b in zip(losses, other_losses)), f"{model} losses differ on {name}"
            assert all(torch.equal(a, b) for a, b in zip(weights, other_weights)), f"{model} weights differ on {name}"


EMBEDDED = """
import os, sys, time
import ravop as R
session = R.initialize(numerics="reproducible", workers=1)
assert os.environ["RAVOP_NUMERICS"] == "reproducible"
log = session.embedded.workers[0][1]
deadline = time.monotonic() + 240
while "serving" not in (open(log).read() if os.path.exists(log) else ""):
    assert time.monotonic() < deadline, "the embedded worker did not start"
    time.sleep(0.1)
print(open(log).read())
# A fit whose EarlyStopping is decided in the loop (its loop_stop op runs in the mode too)
import numpy as np
from ravdl.v2 import NeuralNetwork
from ravdl.v2.callbacks import EarlyStopping
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
X = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
R.Graph(name="stops")
model = NeuralNetwork(optimizer=Adam(), loss="CrossEntropy")
model.add(Dense(8, input_shape=(4,))); model.add(Activation("relu")); model.add(Dense(2))
model.fit(X, (X[:, 0] > 0).astype("int64"), n_epochs=5, batch_size=16, callbacks=[EarlyStopping(monitor="loss")])
R.activate(); R.execute(); R.track_progress(progress_bar=False)
print("fit with EarlyStopping done")
try:
    R.initialize(redis_url=session.url, numerics="reproducible")
except ValueError as exc:
    print("refused:", exc)
"""


def test_initialize_starts_embedded_workers_in_the_mode(tmp_path):
    env = {k: v for k, v in worker_environment().items() if k != numerics_mode.ENV}
    env["RAVOP_DATA_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", EMBEDDED], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reproducible numerics" in done.stdout
    assert "fit with EarlyStopping done" in done.stdout
    assert "refused: numerics= chooses the embedded workers' kernels" in done.stdout
