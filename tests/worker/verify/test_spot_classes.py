"""verify='spot' among honest strangers (issue 42): workers of different numerics classes (CPU classes emulated by
the variables torch's libraries honour, and another thread count) are never accused, a liar among them is caught,
two lying processes of one worker user count as one vote, and a check that cannot settle ends with a verdict.
Real server, real worker processes."""
import re
import time

import numpy as np
import pytest
import redis
import torch

import ravop as R
from helpers import on_one_thread, wait_for
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.core.spot_policy import read_trust
from ravop.runtime.evaluate import evaluate_persisted
from ravop.store import TokenKeys, votes, worker_info
from ravop.store.spot_scripts import SpotScript
from ravop.tools import admin, status
from ravop.tools.cluster_cli import _status_text

from conftest import Workers
from test_spot_checks import branches

# The CPU classes of the issue, as a worker's environment emulates them ("avx2": the machine's own).
CLASSES = {"avx2": {},
           "avx": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AVX", "ONEDNN_MAX_CPU_ISA": "AVX"},
           "sse4": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}}
SEGMENT = ("--checkpoint-steps", "5")
MODEL_TOLERANCE = 1e-3   # the fit's values against a one-thread in-process run of the machine's own class
SPREAD = re.compile(r"'s values are (\S+) from this worker's")

X = np.random.default_rng(2).normal(size=(64, 64)).astype(np.float32)
Y = np.eye(10)[np.random.default_rng(3).integers(0, 10, 64)]


def record_fit(name, verify, epochs=4):
    """A digits-shaped MLP (64 features, 10 classes, cross-entropy, Adam): 8 batches an epoch."""
    graph = R.Graph(name=name, seed=6, verify=verify)
    model = NeuralNetwork(Adam(lr=0.01), loss="CrossEntropy")
    model.add(Dense(32, input_shape=(64,)))
    model.add(Activation("relu"))
    model.add(Dense(10))   # logits: CrossEntropy applies the softmax
    persisted = [*model.fit(X, Y, n_epochs=epochs, batch_size=8, shuffle=True), "prediction"]
    model.predict(X).persist_op("prediction")
    return graph, persisted


def start_classes(workers, extra=SEGMENT):
    """One honest worker of each CPU class on one thread, and one of the machine's own class on two threads."""
    names = [workers.start(1, extra=extra, prefix=cls, env=env)[0] for cls, env in CLASSES.items()]
    return names + workers.start(1, extra=extra, prefix="threads2", threads=2)


def run(timeout=600):
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=timeout)


def assert_close_to_one_class(graph, names):
    want = on_one_thread(evaluate_persisted, graph, names)
    for name in names:
        got = R.fetch_persisting_op(name)
        assert got.shape == want[name].shape and torch.allclose(got, want[name], atol=MODEL_TOLERANCE, rtol=0), name


def spreads(workers, names):
    """Every cross-class distance the workers' checks measured (their logs)."""
    return [float(v) for name in names for v in SPREAD.findall(workers.log(name))]


def test_honest_workers_of_four_classes_complete_a_fit_and_nobody_is_accused(engine, workers, client):
    honest = start_classes(workers)
    classes = {w["name"]: w["numerics"] for w in worker_info.read_all(client)}
    assert len({classes[n] for n in honest}) == 4, classes   # each advertises its own class
    text = _status_text(status.cluster(client, engine.token), "redis://example")   # `ravop status`
    assert all(re.search(rf"{n}\s+{n}\s+cpu.*\s{re.escape(classes[n])}\s", text) for n in honest), text
    graph, names = record_fit("fit", "spot")
    run()
    assert not client.exists(TokenKeys(engine.token).banned), (
        client.smembers(TokenKeys(engine.token).banned), status.failures(client, engine.keys()),
        {n: workers.log(n) for n in honest})
    assert_close_to_one_class(graph, names)
    assert not [f for f in status.failures(client, engine.keys()) if f["reason"] == "verification dispute"]
    trust = read_trust(client.hgetall(TokenKeys(engine.token).trust))
    assert sum(t["confirmed"] for t in trust.values()) >= 2 * 4 and all(t["mismatches"] == 0 for t in trust.values())
    measured = spreads(workers, honest)
    assert measured, "no check compared values across classes"   # the classes' bits did differ
    print(f"honest cross-class spread over 5-step segments: max {max(measured):.3g} of {len(measured)} checks")


def test_a_liar_among_honest_workers_of_four_classes_is_banned_and_nobody_else(engine, workers, client):
    [liar] = workers.start(1, extra=("--test-wrong-outputs=after:1", *SEGMENT), prefix="liar", env=CLASSES["sse4"])
    graph, names = record_fit("fit", "spot")
    R.activate()
    R.execute()
    wait_for(lambda: client.hget(engine.keys().taken, 0) == liar.encode(), "the liar to take the loop")
    honest = start_classes(workers)
    R.track_progress(progress_bar=False, timeout=600)
    assert_close_to_one_class(graph, names)
    assert client.smembers(TokenKeys(engine.token).banned) == {liar.encode()}
    disputes = [f for f in status.failures(client, engine.keys()) if f["reason"] == "verification dispute"]
    assert disputes and all(f["worker"] == liar for f in disputes), disputes
    trust = read_trust(client.hgetall(TokenKeys(engine.token).trust))
    assert all(t["mismatches"] == 0 for m, t in trust.items() if not m.startswith(f"{liar}@")), trust
    assert client.hget(engine.keys().ran, 0).decode() in honest


@pytest.fixture
def worker_user(server, client, tmp_path):
    """A pool of workers that sign in as one ACL worker user ("mallory"), removed afterwards."""
    url, _ = admin.create(client, server.url, "worker", "mallory")
    pool = Workers(url, tmp_path)
    yield pool
    pool.stop_all()
    client.acl_deluser("mallory")


def test_two_liars_of_one_user_do_not_outvote_an_honest_worker(engine, workers, client, worker_user):
    first, second = (worker_user.start(1, extra=("--test-wrong-outputs=after:1", *SEGMENT), prefix="liar")[0]
                     for _ in range(2))
    graph, names = record_fit("fit", R.Verify(settle_seconds=10))
    R.activate()
    R.execute()
    taken = wait_for(lambda: client.hget(engine.keys().taken, 0), "a liar to take the loop").decode()
    assert taken in (first, second)
    [honest] = workers.start(1, extra=SEGMENT)
    with pytest.raises(R.GraphFailedError, match="no majority came within the settle time"):
        R.track_progress(progress_bar=False, timeout=600)
    assert not client.sismember(TokenKeys(engine.token).banned, honest)
    keys = engine.keys()
    for segment in (f for f in client.hkeys(keys.segments(0)) if re.fullmatch(rb"\d+-\d+:[^:]+", f)):
        voters = {m for m in votes.read(client, keys, 0, segment.decode()) if not m.startswith(b"#")}
        assert voters <= {b"mallory", honest.encode()}, voters   # the user's two processes vote as one
    assert not client.sismember(keys.done, 0)   # the liars' values were never accepted
    # the server, not the worker, says whose vote it is: mallory's scripts may name only mallory's key
    as_mallory = redis.Redis.from_url(worker_user.url)
    with pytest.raises(redis.exceptions.NoPermissionError):
        SpotScript(as_mallory).submit(keys, 0, honest, "0" * 64, "cpu", "0-5:" + honest)
    as_mallory.close()


def test_a_check_that_cannot_settle_ends_with_a_verdict(engine, workers, client, no_loop_folding, capsys):
    """One worker: nobody of another user can check it. Plain subgraphs and a fit's segments end unverified at
    the deadline, named in `ravop logs`, and the graphs complete."""
    workers.start(1, extra=SEGMENT)
    _, checked = branches("unsettled", R.Verify(settle_seconds=3))
    assert "but 1 workers are connected; a check waits for more for 3 s, then ends unverified" in \
        capsys.readouterr().err   # R.execute() says so
    verdicts = [f for f in status.failures(client, engine.keys()) if f["reason"] == "unverified"]
    _, plain = branches("plain", 1)
    assert torch.equal(checked, plain)
    assert verdicts and all("no worker of another user checked it within 3 s" in f["error"] for f in verdicts)

    began = time.monotonic()
    graph, names = record_fit("fit", R.Verify(settle_seconds=3), epochs=2)
    run()
    verdicts = [f for f in status.failures(client, engine.keys()) if f["reason"] == "unverified"]
    assert all("no worker of another user checked it within 3 s" in f["error"] for f in verdicts), verdicts
    assert [f for f in verdicts if re.search(r"segment \d+-\d+:\S+: no worker", f["error"])], verdicts
    assert_close_to_one_class(graph, names)
    print(f"a fit whose every check ended unverified: {time.monotonic() - began:.1f} s")


def test_a_numerics_class_names_what_decides_the_bits():
    from ravop.core.numerics_class import numerics_class
    version = torch.__version__.split("+")[0]
    plain = numerics_class("cpu", 2, {})
    assert plain.startswith(f"cpu/torch{version}/") and plain.endswith("/mkl=-/isa=-/t2")
    assert numerics_class("cpu", 1, {"MKL_CBWR": "AVX", "ONEDNN_MAX_CPU_ISA": "AVX"}).endswith("/mkl=AVX/isa=AVX/t1")
    # the reproducible mode promises the same bits on any CPU and thread count: neither is part of its class
    assert numerics_class("cpu", 8, {"RAVOP_NUMERICS": "reproducible", "MKL_CBWR": "AVX"}) == \
        f"reproducible/torch{version}/cpu"
    with pytest.raises(ValueError, match="RAVOP_NUMERICS='fast': must be one of default, reproducible"):
        numerics_class("cpu", 1, {"RAVOP_NUMERICS": "fast"})


def test_the_distance_between_two_runs_values():
    from ravop.core.spot_policy import principal_of, scaled_difference
    a = [torch.tensor([1.0, 1000.0]), torch.tensor([3, 4])]
    assert scaled_difference(a, [t.clone() for t in a]) == 0
    assert scaled_difference(a, [torch.tensor([1.0 + 2e-6, 1000.0]), a[1]]) == pytest.approx(1e-6 / 2 ** 0.5, rel=0.05)  # RMS over 2
    assert scaled_difference(a, [torch.tensor([1.0, 1001.0]), a[1]]) == pytest.approx(1 / 1002 / 2 ** 0.5)   # relative: /(1 + 1001)
    assert scaled_difference(a, [a[0], torch.tensor([3, 5])]) == float("inf")   # integers agree exactly
    assert scaled_difference(a, [a[0].double(), a[1]]) == float("inf")
    assert scaled_difference([torch.tensor([float("nan")])], [torch.tensor([float("nan")])]) == 0
    assert scaled_difference([torch.tensor([float("nan")])], [torch.tensor([0.0])]) == float("inf")
    assert principal_of("default", "w-1") == "w-1" and principal_of("mallory", "w-1") == "mallory"
    with pytest.raises(ValueError, match="may not be empty nor hold"):
        principal_of("a:b", "w-1")
