"""Real runs of the features granted by reading code, as token user A (`ravop admin`) with its workers running as a
worker user, on a server of their own: spot checks with a liar (a dispute on plain subgraphs and on a fit's
segments), a stop and a cancel of a running loop by the token user (the CLI with its URL, and the API), resident
replicas releasing their exchanges, `ravop status` with the trust table and `ravop logs` with the disputes. After
each, the server's ACL LOG holds nothing but the probes refused by design (tests/security/test_acl.py)."""
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
import redis
import torch

from ravdl.v2.callbacks import EarlyStopping
import ravop as R
from ravop.core import graph_states
from ravop.core.spot_policy import read_trust
from ravop.runtime.evaluate import evaluate_persisted
from ravop.store import ensure_queues
from ravop.store import graphs as store_graphs
from ravop.store.keys import TOKENS, GraphKeys, TokenKeys
from ravop.store.threat_model import TOKEN_A, TOKEN_B
from ravop.tools import admin, status

from conftest import Workers
from helpers import assert_a_valid_graph_runs, on_one_thread, wait_for
from test_acl import _square, acl_server, users  # noqa: F401  (the fixtures: a server of its own, its ACL users)
from test_cli import ravop
from test_spot_checks import assert_honest_bits

WORKER = "wk"
# Two more worker users: spot checks count one vote per user, so the liar (a process of WORKER) is checked by
# workers of the others.
HONEST_USERS = ("wk-b", "wk-c")
# Refusals that are the design (tests/security/test_acl.py): the requester's script probe (it then goes without) and the
# streams' group (the workers' to make), CONFIG GET and redis-py's CLIENT SETINFO. `ravop logs` as a token user
# does not ask for the dead letters (every token's failures, not granted: its graph's failure is in its meta).
PROBES = {(TOKEN_A, "evalsha"), (TOKEN_A, "xgroup|create")} | {
    (user, command) for user in (TOKEN_A, TOKEN_B, WORKER, *HONEST_USERS)
    for command in ("config|get", "client|setinfo")}


def _fresh(server):
    """An empty store with the tokens registered and the work streams made, the ACL LOG empty; the admin client."""
    admin = redis.Redis.from_url(server.url)
    admin.flushall()
    admin.sadd(TOKENS, TOKEN_A, TOKEN_B)
    ensure_queues(admin)
    admin.execute_command("ACL", "LOG", "RESET")
    return admin


def _refusals(admin):
    """The ACL LOG's refusals outside PROBES, as {(user, command or key, reason, context, the client's last command)}."""
    entries = [{k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
                for k, v in (e.items() if isinstance(e, dict) else zip(e[::2], e[1::2]))}
               for e in admin.execute_command("ACL", "LOG", "128")]
    found = {(e["username"], e["object"], e["reason"], e["context"],
              re.search(r"cmd=(\S+)", e.get("client-info", "")).group(1)) for e in entries}
    return {entry for entry in found if entry[:2] not in PROBES}


@pytest.fixture(scope="module")
def honest_urls(acl_server):
    """{user: URL} of the two more worker users."""
    admin_client = redis.Redis.from_url(acl_server.url)
    urls = {user: admin.create(admin_client, acl_server.url, "worker", user)[0] for user in HONEST_USERS}
    admin_client.close()
    return urls


@pytest.fixture
def run(acl_server, users, tmp_path):
    """An empty store, worker processes of the worker user (`run.pool`), the session and `run.owner` as token user
    A; afterwards the ACL LOG must hold nothing but PROBES."""
    admin = _fresh(acl_server)
    pool = Workers(users["a worker"], tmp_path)
    url = users["token user A"]
    owner = redis.Redis.from_url(url)
    session = R.initialize(redis_url=url)
    yield SimpleNamespace(admin=admin, pool=pool, owner=owner, url=url, session=session)
    pool.stop_all()
    owner.close()
    refused = _refusals(admin)
    admin.close()
    assert not refused, refused


def _no_errors(pool):
    for name in pool.procs:
        log = pool.log(name)
        assert "NOPERM" not in log and "Traceback" not in log, (name, log)


def test_spot_checks_with_a_liar_as_a_token_user_on_worker_users(run, honest_urls, tmp_path, no_loop_folding):
    """Worker processes of three worker users, the liar's user (WORKER) with one: the spot checks write the token's
    trust, the graph's votes and the disputes; the liar's user is banned for the token and named in `ravop status`
    and `ravop logs` run with the token user's URL."""
    from test_spot_checks import branches
    pools = []
    for user, url in honest_urls.items():
        (tmp_path / user).mkdir(exist_ok=True)
        pools.append(Workers(url, tmp_path / user))
    try:
        for pool in pools:
            pool.start(1)
        _, plain = branches("plain", 1)
        run.pool.start(1, extra=["--test-wrong-outputs"], prefix="liar")
        banned = TokenKeys(TOKEN_A).banned
        for attempt in range(6):   # until the liar took part in a check (it races two honest workers for work)
            _, checked = branches(f"spot-{attempt}", "spot")
            assert torch.equal(checked, plain)
            if run.owner.sismember(banned, WORKER):
                break
        assert run.owner.smembers(banned) == {WORKER.encode()}   # votes, bans and trust are per user
        trust = read_trust(run.owner.hgetall(TokenKeys(TOKEN_A).trust))
        [liar_trust] = [t for member, t in trust.items() if member.startswith(f"{WORKER}@")]
        assert liar_trust["mismatches"] >= 1
        report = json.loads(ravop("status", "--redis", run.url, "--json").stdout)
        rows = {row["worker"]: row for row in report["trust"]}
        assert rows[WORKER]["banned"] and rows[WORKER]["mismatches"] >= 1
        assert not any(rows[user]["banned"] for user in HONEST_USERS if user in rows)
        text = ravop("status", "--redis", run.url).stdout
        assert "trust (verify='spot')" in text and re.search(rf"{WORKER}\s+cpu/\S+\s+\d+\s+0\s+\d+\s+[1-9]\d*\s+yes",
                                                               text)
        logs = ravop("logs", run.session.keys().graph_id, "--redis", run.url).stdout
        assert "verification dispute" in logs and WORKER in logs, logs
        for pool in (run.pool, *pools):
            _no_errors(pool)
    finally:
        for pool in pools:
            pool.stop_all()


def test_a_liar_in_a_fit_under_spot_checks_as_a_token_user(run, honest_urls, tmp_path, monkeypatch):
    """A loop under spot checks: checkpoints every 5 steps (segments; in chunks of 128 bytes), a liar of user
    WORKER from its second segment on (`--test-wrong-outputs=after:1`), checked by workers of two other users:
    dispute traces narrowed to the op, a rewind, an honest finish."""
    from test_spot_checks import record_fit
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", "128")   # the workers inherit it: checkpoints and outputs in chunks
    [liar] = run.pool.start(1, extra=("--test-wrong-outputs=after:1", "--checkpoint-steps", "5"), prefix="liar")
    graph, names = record_fit("fit", "spot")
    R.activate()
    R.execute()
    keys = run.session.keys()
    wait_for(lambda: run.owner.hget(keys.taken, 0) == liar.encode(), "the liar to take the loop")
    pools = []
    for user, url in honest_urls.items():
        (tmp_path / user).mkdir(exist_ok=True)
        pools.append(Workers(url, tmp_path / user))
    try:
        honest = [pool.start(1, extra=("--checkpoint-steps", "5"))[0] for pool in pools]
        R.track_progress(progress_bar=False, timeout=600)
        assert_honest_bits(graph, names)
        assert run.owner.smembers(TokenKeys(TOKEN_A).banned) == {WORKER.encode()}
        assert run.owner.hget(keys.ran, 0).decode() in honest
        lines = [f["error"] for f in status.failures(run.owner, keys)]
        # a dispute names the disputants by user
        assert any(re.match(rf"worker {WORKER} and ({'|'.join(HONEST_USERS)}) differ first at step \d+, op '", line)
                   for line in lines), lines
        assert f"worker {WORKER} and " in ravop("logs", keys.graph_id, "--redis", run.url).stdout
        for pool in (run.pool, *pools):
            _no_errors(pool)
    finally:
        for pool in pools:
            pool.stop_all()


def test_a_token_user_stops_and_cancels_running_loops(run):
    """`ravop stop` and `ravop cancel` with the token user's URL, then EarlyStopping and `status.cancel` from the API,
    each on a loop running on a worker user: stopped at an epoch boundary with the bits of the shorter run ('done
    (stopped early)'), or 'cancelled'."""
    from test_callbacks import model
    from test_stop_loop import BATCH, LONG, ROWS, assert_the_bits_of_the_fit_recorded, record
    # each loop step paced to ~4 ms, whatever the host's load: the runs asked to stop last for minutes otherwise,
    # so the request always arrives before their end (EarlyStopping's 5,000 epochs took ~1 s at full speed)
    run.pool.start(1, extra=("--emulate-device-flops", "4e6"))
    net, history = record(LONG, "stopped")
    R.activate()
    R.execute()
    keys = run.session.keys()
    wait_for(lambda: store_graphs.steps_done(run.owner, keys) >= 3 * ROWS // BATCH, "three epochs run")
    assert "stop at their next epoch boundary" in ravop("stop", keys.graph_id, "--reason", "enough", "--redis",
                                                        run.url).stdout
    R.track_progress(progress_bar=False)
    meta = run.owner.hgetall(keys.meta)
    assert meta[b"state"] == graph_states.DONE.encode()
    epochs = history.stopped_after
    assert meta[b"stopped"].decode() == f"stopped early at epoch {epochs} of {LONG} (enough)"
    assert meta[b"stop_by"].decode().startswith("ravop stop (")
    assert "done (stopped early)" in ravop("graphs", "--redis", run.url).stdout
    assert_the_bits_of_the_fit_recorded(epochs, net, history)

    # EarlyStopping: the requester's fit callback asks the stop
    R.Graph(name="early-stop")
    net, X, y = model()
    stopper = EarlyStopping(monitor="val_loss", patience=0, min_delta=1e9)
    early = net.fit(X, y, n_epochs=5000, batch_size=16, callbacks=[stopper])
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    meta = store_graphs.read_state(run.owner, run.session.keys())
    assert meta["state"] == graph_states.DONE and 2 <= early.stopped_after < 5000
    assert meta["stopped"].startswith(f"stopped early at epoch {early.stopped_after} of 5000 (EarlyStopping")

    # cancel: the CLI, then the API
    for how in ("cli", "api"):
        record(LONG, f"cancelled by {how}")
        R.activate()
        R.execute()
        keys = run.session.keys()
        wait_for(lambda: store_graphs.steps_done(run.owner, keys) >= 8, "the loop running")
        if how == "cli":
            assert f"graph {keys.graph_id}: cancelled" in ravop("cancel", keys.graph_id, "--redis", run.url).stdout
        else:
            assert status.cancel(run.owner, keys, origin="a test")
        wait_for(lambda: store_graphs.read_state(run.owner, keys)["state"] == graph_states.CANCELLED, "cancelled")
        assert store_graphs.steps_done(run.owner, keys) < LONG * ROWS // BATCH
        assert "cancelled: by " in ravop("logs", keys.graph_id, "--redis", run.url).stdout
    assert_a_valid_graph_runs()   # the worker takes new work at once
    _no_errors(run.pool)


def test_a_token_user_stops_a_spot_checked_fit(run, honest_urls, tmp_path):
    """A stop asked from the API (ravop.tools.status.request_stop: STOP's fields written without a script by a token
    user) of a fit under verify='spot' on workers of two worker users checkpointing every 5 steps (one segment an
    epoch): the loop ends at an epoch boundary, its last segment checked, with the prediction of the fit recorded
    that long."""
    run.pool.start(1, extra=("--checkpoint-steps", "5"))
    user, url = next(iter(honest_urls.items()))   # a check needs a worker of another user
    (tmp_path / user).mkdir()
    other = Workers(url, tmp_path / user)
    other.start(1, extra=("--checkpoint-steps", "5"))
    try:
        _stop_a_spot_checked_fit(run)
    finally:
        other.stop_all()
    _no_errors(other)


def _stop_a_spot_checked_fit(run):
    from test_spot_checks import record_fit
    record_fit("long", "spot", epochs=2000)
    R.activate()
    R.execute()
    keys = run.session.keys()
    wait_for(lambda: store_graphs.steps_done(run.owner, keys) >= 15, "three epochs run")
    assert status.request_stop(run.owner, keys, "enough", "a test")
    R.track_progress(progress_bar=False, timeout=600)
    meta = store_graphs.read_state(run.owner, keys)
    assert meta["state"] == graph_states.DONE, meta
    epochs = int(meta["stopped"].split("at epoch ")[1].split(" ")[0])
    assert meta["stopped"] == f"stopped early at epoch {epochs} of 2000 (enough)"
    assert int(run.owner.hget(keys.meta, "stopped_step")) == 5 * epochs
    prediction = R.fetch_persisting_op("prediction")
    trust = read_trust(run.owner.hgetall(TokenKeys(TOKEN_A).trust))
    assert sum(t["confirmed"] for t in trust.values()) >= 2 and all(t["mismatches"] == 0 for t in trust.values())
    short, _ = record_fit("short", "spot", epochs=epochs)
    assert torch.equal(on_one_thread(evaluate_persisted, short, ["prediction"])["prediction"], prediction)
    _no_errors(run.pool)


def test_resident_replicas_release_their_exchanges_as_worker_users(run):
    """Resident replicas averaging every step (LocalSGD), checkpointing every 3 steps: their exchanged values are
    acknowledged (INCRBY) and deleted once every reader checkpointed past them; the in-process bits, the exchange
    keys released as they went."""
    from test_exchange_release import exchange_footprint, record as record_replicas
    run.pool.start(2, extra=("--checkpoint-steps", "3"))
    graph, persisted = record_replicas("acl release", 6, R.parallel.LocalSGD(2, sync_every=1, resident=True))
    R.activate()
    R.execute()
    R.track_progress(timeout=600, progress_bar=False)
    assert_honest_bits(graph, persisted)
    assert exchange_footprint(run.admin, GraphKeys(TOKEN_A, graph.id))[0] < 24 * 8 / 4
    _no_errors(run.pool)


def test_a_scheduled_fit_with_chunked_checkpoints_as_a_token_user(run, monkeypatch):
    """An lr schedule inside the optimizer's step ops, checkpoints every 3 steps written in chunks of 1 KiB (the
    requester's constants too), on two worker processes: the in-process bits."""
    from ravdl.v2 import NeuralNetwork
    from ravdl.v2.layers import Activation, Dense
    from ravdl.v2.lr_schedules import CosineAnnealingLR, LinearLR, SequentialLR
    from ravdl.v2.optimizers import Adam
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", "1024")
    run.pool.start(2, extra=("--checkpoint-steps", "3"))
    graph = R.Graph(name="scheduled", seed=4)
    rng = np.random.default_rng(8)
    X, y = rng.normal(size=(48, 16)), rng.normal(size=(48, 2))
    schedule = SequentialLR([LinearLR(0.2, total_iters=3), CosineAnnealingLR(T_max=8)], [3])
    net = NeuralNetwork(Adam(lr=0.01, lr_schedule=schedule), loss="SquareLoss")
    net.add(Dense(32, input_shape=(16,)))
    net.add(Activation("tanh"))
    net.add(Dense(2))
    names = [*net.fit(X, y, n_epochs=8, batch_size=8, shuffle=True), "prediction"]
    net.predict(X).persist_op("prediction")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=600)
    assert_honest_bits(graph, names)
    _no_errors(run.pool)


def test_workers_repair_a_lost_consumer_group_and_leave_a_retyped_stream_to_ravop_admin(run, acl_server):
    """Damaged work streams met by worker-user processes (worker/serve/server_errors.py, ravop.store.repair): a
    destroyed consumer group is made again by a worker (XGROUP CREATE, granted); a stream replaced by a string cannot be
    deleted by a worker (DEL on the work streams is refused by design: a worker may not destroy them), the
    workers ride it out and say so, and `ravop admin` repairs it; the token user's graphs then run."""
    from ravop.store.keys import GROUP, queue
    names = run.pool.start(2)
    run.admin.xgroup_destroy(queue("cpu"), GROUP)
    wait_for(lambda: run.admin.xinfo_groups(queue("cpu")), "a worker to make the consumer group again")
    assert torch.equal(_square("after a lost group", 2.0), torch.full((128, 128), 4.0 * 128))
    assert not _refusals(run.admin)

    run.admin.delete(queue("cpu"))
    run.admin.set(queue("cpu"), "not a stream")
    wait_for(lambda: any("cannot repair the work streams" in run.pool.log(n) for n in names), "a worker to say so")
    assert run.admin.type(queue("cpu")) == b"string"
    refused = _refusals(run.admin)
    assert refused and all(entry[:4] == (WORKER, queue("cpu"), "key", "toplevel") for entry in refused), refused
    assert f"repaired {queue('cpu')} was a string" in ravop("admin", "token", "list", "--redis",
                                                            acl_server.url).stderr
    run.admin.execute_command("ACL", "LOG", "RESET")
    assert torch.equal(_square("after a retyped stream", 3.0), torch.full((128, 128), 9.0 * 128))
    assert all(run.pool.alive(n) for n in names)
    logs = "".join(run.pool.log(n) for n in names)
    assert "had lost its consumer group 'workers': made again" in logs, logs
