"""Adaptive spot checks, `R.Graph(verify='spot')` (docs/operators/verification.md): real server, real worker processes.
A new worker's results are all checked by another worker until it is trusted; a liar is outvoted by a third run,
banned for the token and named in `ravop logs`, and the graph ends with the honest bits."""
import re

import numpy as np
import pytest
import torch

from compiler.cost import DEVICES
import ravop as R
from helpers import on_one_thread, wait_for
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.core.spot_policy import Verify, read_trust
from ravop.runtime.evaluate import evaluate_persisted
from ravop.store import TokenKeys, votes
from ravop.tools import status
from ravop.tools.cluster_cli import _status_text
from worker.verify.dispute_trace import Tracer, first_difference, unpack


def branches(name, verify):
    """Two independent matmul branches (two subgraphs) and their product (a third); plain subgraphs, with loop
    folding off (the tests' `no_loop_folding`: the branches' repeated steps would fold into a loop)."""
    R.Graph(name=name, verify=verify)
    generator = torch.Generator().manual_seed(1)
    left, right = (R.t(torch.rand(384, 384, generator=generator) / 384) for _ in range(2))
    for _ in range(4):
        left, right = R.tanh(left @ left), R.tanh(right @ right)
    (left @ right).persist_op("out")
    summary = R.activate(devices=DEVICES)   # fixed cost figures: the branches stay apart
    assert summary["subgraphs"] >= 2
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    return summary, R.fetch_persisting_op("out")


def test_spot_checks_on_honest_workers_give_the_unverified_bits_and_build_trust(engine, workers, client,
                                                                               no_loop_folding):
    names = workers.start(2)
    _, plain = branches("plain", 1)
    summary, checked = branches("spot", R.Verify(rate=0.0, trust_after=50))
    assert torch.equal(checked, plain)
    keys = engine.keys()
    for sid in range(summary["subgraphs"]):   # nobody is trusted yet: every result was checked, and agreed
        cast = votes.read(client, keys, sid)
        assert cast[b"#state"] == b"confirmed" and len({v for k, v in cast.items() if not k.startswith(b"#")}) == 1
    trust = read_trust(client.hgetall(TokenKeys(engine.token).trust))
    assert sum(t["confirmed"] for t in trust.values()) == 2 * summary["subgraphs"]
    # trust is per principal (here each worker's own name: the server has no users) and numerics class
    assert {m.partition("@")[0] for m in trust} == set(names) and all(t["mismatches"] == 0 for t in trust.values())
    assert all(m.partition("@")[2].startswith("cpu/torch") for m in trust)

    summary, trusted = branches("trusted", R.Verify(rate=0.0, trust_after=1))   # both are trusted now
    assert torch.equal(trusted, plain)
    keys = engine.keys()
    assert all(votes.check(client, keys, sid).state == "unchecked" for sid in range(summary["subgraphs"]))


def test_a_liar_is_outvoted_banned_and_named_and_the_result_is_honest(engine, workers, client, no_loop_folding):
    workers.start(2)
    _, plain = branches("plain", 1)
    [liar] = workers.start(1, extra=["--test-wrong-outputs"], prefix="liar")
    workers.start(1)
    for attempt in range(4):   # until the liar took part in a check (it races three honest workers for work)
        _, checked = branches(f"spot-{attempt}", "spot")
        assert torch.equal(checked, plain)
        if client.sismember(TokenKeys(engine.token).banned, liar):
            break
    assert client.smembers(TokenKeys(engine.token).banned) == {liar.encode()}
    trust = read_trust(client.hgetall(TokenKeys(engine.token).trust))
    [liar_trust] = [t for m, t in trust.items() if m.startswith(f"{liar}@")]
    assert liar_trust["mismatches"] >= 1 and liar_trust["streak"] == 0
    disputes = [f for f in status.failures(client, engine.keys()) if f["reason"] == "verification dispute"]
    assert disputes and all(f["worker"] == liar for f in disputes)

    report = status.cluster(client, engine.token)   # what `ravop status` and the dashboard show
    rows = {row["worker"]: row for row in report["trust"]}
    assert rows[liar]["banned"] and rows[liar]["mismatches"] >= 1 and rows[liar]["kind"].startswith("cpu/")
    assert not any(row["banned"] or row["mismatches"] for worker, row in rows.items() if worker != liar)
    text = _status_text(report, "redis://example")
    assert "trust (verify='spot')" in text and re.search(rf"{liar}\s+cpu/\S+\s+\d+\s+0\s+\d+\s+[1-9]\d*\s+yes", text)


def test_verify_spot_is_checked():
    with pytest.raises(ValueError, match="'spot' or R.Verify"):
        R.Graph(verify="always")
    with pytest.raises(ValueError, match="rate=.*from 0 to 1"):
        R.Verify(rate=1.5)
    with pytest.raises(ValueError, match="trust_after"):
        R.Verify(trust_after=-1)
    with pytest.raises(ValueError, match="copies"):
        R.Verify(copies=1)
    with pytest.raises(ValueError, match="tolerance=.*positive finite"):
        R.Verify(tolerance=0)
    with pytest.raises(ValueError, match="settle_seconds=.*positive finite"):
        R.Verify(settle_seconds=float("inf"))
    with pytest.raises(ValueError, match="does not apply to a federated graph"):
        R.Graph(approach="federated", rules='{"rules": {"age": {}}, "max_clients": 1}', verify="spot")
    assert R.Graph(verify="spot").spot == R.Verify()


X = np.random.default_rng(2).normal(size=(40, 4))
Y = np.eye(3)[np.random.default_rng(3).integers(0, 3, 40)]


def record_fit(name, verify, epochs=6):
    """A small fit: 5 batches an epoch, so with workers checkpointing every 5 steps one segment an epoch."""
    graph = R.Graph(name=name, seed=6, verify=verify)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(16, input_shape=(4,)))
    model.add(Activation("relu"))
    model.add(Dense(3))
    persisted = [*model.fit(X, Y, n_epochs=epochs, batch_size=8, shuffle=True), "prediction"]
    model.predict(X).persist_op("prediction")
    return graph, persisted


def assert_honest_bits(graph, names):
    want = on_one_thread(evaluate_persisted, graph, names)
    for name in names:
        assert torch.equal(R.fetch_persisting_op(name), want[name]), name


def test_a_fit_under_spot_checks_on_honest_workers_gives_the_unverified_bits(engine, workers, client):
    workers.start(2, extra=("--checkpoint-steps", "5"))
    graph, names = record_fit("fit", "spot")
    summary = R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=600)
    assert_honest_bits(graph, names)
    trust = read_trust(client.hgetall(TokenKeys(engine.token).trust))
    assert sum(t["confirmed"] for t in trust.values()) >= 2 * 6   # both runs of each of the loop's 6 segments
    assert all(t["mismatches"] == 0 for t in trust.values())
    assert not client.keys(engine.keys().prefix + "ckpt:*"), "the segments' checkpoints are dropped at the end"


def test_a_liar_running_a_fit_is_caught_rewound_banned_and_the_dispute_names_the_op(engine, workers, client):
    """The liar takes the loop (it is alone when the fit starts), is honest for its first segment, then perturbs
    a kernel's output at every step: its second segment's check disagrees, a third worker sides with the
    checker, the liar is banned, the loop rewinds to the confirmed checkpoint and an honest worker finishes it."""
    [liar] = workers.start(1, extra=("--test-wrong-outputs=after:1", "--checkpoint-steps", "5"), prefix="liar")
    graph, names = record_fit("fit", "spot")
    R.activate()
    R.execute()
    keys = engine.keys()
    wait_for(lambda: client.hget(keys.taken, 0) == liar.encode(), "the liar to take the loop")
    honest = workers.start(2, extra=("--checkpoint-steps", "5"))
    R.track_progress(progress_bar=False, timeout=600)
    assert_honest_bits(graph, names)
    assert client.smembers(TokenKeys(engine.token).banned) == {liar.encode()}
    assert client.hget(keys.ran, 0).decode() in honest   # the loop was finished by an honest worker

    perturbed = re.search(r"perturbing op '(\w+)' recorded at (\S+)", workers.log(liar))
    assert perturbed, workers.log(liar)
    lines = [f["error"] for f in status.failures(client, keys)]
    # it perturbs from the first step of each segment after its first (steps 6-10, 11-15, ...): the settled
    # disputes (a segment rewound away before its check settled is dropped) name that step and that op
    pattern = (rf"worker {liar} and ({'|'.join(honest)}) differ first at step (\d+), op '{perturbed.group(1)}' "
               rf"recorded at {re.escape(perturbed.group(2))}")
    narrowed = [re.fullmatch(pattern, line) for line in lines if line.startswith(f"worker {liar} and ")]
    assert narrowed and all(narrowed), lines
    assert all(int(found.group(2)) in (6, 11, 16, 21, 26) for found in narrowed), lines
    assert re.search(r"test_spot_checks\.py:\d+$", perturbed.group(2))   # the user's line, as recorded


def test_a_trace_names_the_first_differing_step_and_op():
    def trace(steps):
        tracer = Tracer()
        for template, values in steps:
            for index, value in enumerate(values):
                tracer._record(template, index, value)
            tracer.step()
        return unpack(tracer.bytes())
    honest = [(0, [torch.ones(3), torch.zeros(2)]), (0, [torch.ones(3), torch.ones(2)])]
    lied = [(0, [torch.ones(3), torch.zeros(2)]), (0, [torch.ones(3), torch.full((2,), 2.0)])]
    assert first_difference(trace(honest), trace(honest)) is None
    assert first_difference(trace(lied), trace(honest)) == (1, 0, 1)
    assert first_difference(trace(honest[:1]), trace(honest)) == (1, None, None)


def test_a_policy_travels_in_the_meta_unchanged():
    policy = R.Verify(rate=0.25, trust_after=3, copies=3, tolerance=1e-5, settle_seconds=30)
    assert Verify.decode(policy.encode().encode()) == policy
    with pytest.raises(ValueError, match="malformed spot-check policy"):
        Verify.decode("0.1;ten;2")
