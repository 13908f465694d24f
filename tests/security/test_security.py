"""Per-token access on a shared server, enforced by the server's ACLs (`ravop admin`): a requester cannot read,
fetch, flush or track another token's graphs; a worker cannot flush, list or delete graphs; a revoked user is
refused at once; forged queue messages do not disturb the graph they name; `rediss://` works; a token that is
a secret never appears in errors, output or logs."""
import json
import secrets
import time
import uuid

import pytest
import redis
import torch

import ravop as R
from ravop.core.errors import ConnectionFailed
from ravop.store import DEAD_LETTER, GraphKeys, TokenKeys, connect, queue
from ravop.tools import admin

from conftest import Workers
from test_cli import ravop, train_small_model
from tls_proxy import TlsProxy, self_signed_certificate


def create_user(url, kind, name):
    """The URL printed as the last line of `ravop admin KIND create NAME --redis URL`."""
    return ravop("admin", kind, "create", name, "--redis", url).stdout.strip().splitlines()[-1]


def create_user_in_process(url, kind, name):
    """The same user through `ravop.tools.admin` (what the command runs), without a process importing torch."""
    with connect(url) as client:
        return admin.create(client, url, kind, name)[0]


def run_graph(name, value):
    R.Graph(name=name)
    x = R.t(torch.full((128, 128), float(value)))
    (x @ x).persist_op("product")
    assert R.activate()["subgraphs"] == 1   # run by a worker, not folded at activate
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    return R.fetch_persisting_op("product")


@pytest.fixture
def users(server, engine, tmp_path):
    """Two token users, a worker user (with one worker process running as it), all removed afterwards (and,
    through `engine`, the session put back on the server's default user: the next tests' sessions must not
    be left on a deleted user)."""
    suffix = uuid.uuid4().hex[:6]
    names = {"a": f"alice-{suffix}", "b": f"bob-{suffix}", "w": f"prov-{suffix}"}
    urls = {"a": create_user_in_process(server.url, "token", names["a"]),
            "b": create_user_in_process(server.url, "token", names["b"]),
            "w": create_user(server.url, "worker", names["w"])}
    pool = Workers(urls["w"], tmp_path)
    pool.start(1)
    yield names, urls, pool
    pool.stop_all()
    admin = redis.Redis.from_url(server.url)
    for name in names.values():
        admin.execute_command("ACL", "DELUSER", name)
    for key in admin.scan_iter(match=f"ravop:*-{suffix}:*"):
        admin.delete(key)
    admin.close()


def test_tokens_see_only_their_own_graphs(server, users, capsys):
    names, urls, pool = users
    assert "unix://" in urls["a"] and f"{names['a']}:" in urls["a"]
    session = R.initialize(redis_url=urls["a"])        # the token is the URL's user
    assert session.token == names["a"]
    assert torch.equal(run_graph("secret-work", 3), torch.full((128, 128), 9.0 * 128))
    keys_a = session.keys()

    thief = redis.Redis.from_url(urls["b"])
    denied = redis.exceptions.NoPermissionError
    for attempt in (lambda: thief.get(keys_a.tensor(0)), lambda: thief.hgetall(keys_a.meta),   # read
                    lambda: thief.hget(keys_a.persist, "product"),                               # fetch
                    lambda: thief.xread({keys_a.events: "0-0"}),                                 # track
                    lambda: thief.zrange(TokenKeys(names["a"]).graphs, 0, -1),                   # list
                    lambda: thief.delete(keys_a.meta), lambda: thief.unlink(keys_a.meta),         # delete
                    lambda: thief.flushdb(), lambda: thief.flushall(), lambda: thief.keys("*"),   # flush
                    lambda: thief.xrange(DEAD_LETTER), lambda: thief.config_get("*"),
                    lambda: thief.execute_command("ACL", "LIST")):
        with pytest.raises(denied):
            attempt()
    with pytest.raises(ConnectionFailed, match="may not use token"):     # B asking for A's token
        R.initialize(token=names["a"], redis_url=urls["b"])
    assert ravop("graphs", "--redis", urls["b"], "--token", names["a"], check=False).returncode != 0

    R.initialize(redis_url=urls["b"])
    assert torch.equal(run_graph("bobs", 1), torch.full((128, 128), 128.0))
    R.flush()                                                # flushes B's graphs only
    assert not thief.exists(TokenKeys(names["b"]).graphs)
    R.initialize(redis_url=urls["a"])
    assert torch.equal(R.fetch_persisting_op("product"), torch.full((128, 128), 9.0 * 128))
    listed = json.loads(ravop("graphs", "--redis", urls["a"], "--json").stdout)
    assert [g["name"] for g in listed["graphs"]] == ["secret-work"]

    # B may not write the work streams (tests/security/test_acl.py tries every command); what it can write, its own
    # inbox, names graphs of its own token only: A's graph id there is dropped, and A's graph is untouched.
    R.Graph(name="long-wait", gpu_required="yes")                 # running, waiting for a GPU worker
    x = R.t(torch.ones(128, 128))
    (x @ x).persist_op("p")
    R.activate()
    R.execute()
    waiting = R.initialize(redis_url=urls["a"]).keys()
    with pytest.raises(denied):
        thief.xadd(queue("cpu"), {"token": names["a"], "graph": waiting.graph_id, "subgraph": "99"})
    thief.zadd(TokenKeys(names["b"]).inbox, {waiting.graph_id: 0})
    admin = redis.Redis.from_url(server.url)
    deadline = time.monotonic() + 20
    while thief.zscore(TokenKeys(names["b"]).inbox, waiting.graph_id) is not None:
        assert time.monotonic() < deadline, [pool.log(n) for n in pool.procs]
        time.sleep(0.05)
    assert admin.hget(waiting.meta, "state") == b"running"
    assert not admin.exists(GraphKeys(names["b"], waiting.graph_id).meta)
    assert ravop("cancel", waiting.graph_id, "--redis", urls["b"], check=False).returncode != 0
    assert "cancelled" in ravop("cancel", waiting.graph_id, "--redis", urls["a"]).stdout   # only its owner can
    assert admin.hget(waiting.meta, "state") == b"cancelled"
    admin.close()
    thief.close()


def test_a_worker_user_cannot_flush_list_or_delete_graphs(server, users):
    names, urls, _ = users
    R.initialize(redis_url=urls["a"])
    run_graph("kept", 2)
    keys = R.initialize(redis_url=urls["a"]).keys()
    worker = redis.Redis.from_url(urls["w"])
    assert worker.hget(keys.meta, "state") == b"done"   # it reads plans and tensors: it runs them
    denied = redis.exceptions.NoPermissionError
    # SCAN is granted (issue 44): a worker sizes a token's keys against its memory quota; it lists names, not values
    for attempt in (lambda: worker.flushdb(), lambda: worker.flushall(), lambda: worker.keys("*"),
                    lambda: worker.delete(keys.meta), lambda: worker.unlink(keys.subgraphs),
                    lambda: worker.delete(TokenKeys(names["a"]).graphs),
                    lambda: worker.get(TokenKeys(names["a"]).current),
                    lambda: worker.xtrim(queue("cpu"), 0), lambda: worker.xgroup_destroy(queue("cpu"), "workers"),
                    lambda: worker.srem(TokenKeys(names["a"]).banned, names["w"]),
                    lambda: worker.execute_command("ACL", "LIST"), lambda: worker.config_set("maxmemory", "1")):
        with pytest.raises(denied):
            attempt()
    assert worker.hget(keys.meta, "state") == b"done"
    worker.close()


def test_a_revoked_token_is_refused_at_once(server, users):
    names, urls, _ = users
    session = R.initialize(redis_url=urls["a"])
    run_graph("before-revoke", 1)
    out = ravop("admin", "token", "revoke", names["a"], "--redis", server.url).stdout
    assert f"revoked token user {names['a']!r}" in out
    with pytest.raises(redis.exceptions.ConnectionError):      # its open connection is closed by the server
        session.client.get(TokenKeys(names["a"]).current)
    secret = urls["a"].split(":")[2].split("@")[0]
    with pytest.raises(ConnectionFailed) as refused:
        R.initialize(redis_url=urls["a"])
    assert secret not in str(refused.value) and "***" in str(refused.value)
    listed = ravop("admin", "token", "list", "--redis", server.url, "--json").stdout
    assert names["a"] not in listed and names["b"] in listed
    assert names["w"] in ravop("admin", "worker", "list", "--redis", server.url).stdout


def test_only_an_admin_manages_users(server, users):
    _, urls, _ = users
    result = ravop("admin", "token", "create", "mallory", "--redis", urls["b"], check=False)
    assert result.returncode == 1 and "may not manage users" in result.stderr


def test_rediss_with_a_private_ca(server, tmp_path, users):
    names, urls, _ = users
    cert, key = self_signed_certificate(tmp_path)
    proxy = TlsProxy(server.socket, cert, key)
    try:
        secret = urls["a"].split("@")[0].split(":")[-1]
        tls_url = f"rediss://{names['a']}:{secret}@localhost:{proxy.port}/0?ssl_ca_certs={cert}"
        worker_secret = urls["w"].split("@")[0].split(":")[-1]
        pool = Workers(f"rediss://{names['w']}:{worker_secret}@localhost:{proxy.port}/0?ssl_ca_certs={cert}",
                       tmp_path)
        [name] = pool.start(1)
        try:
            R.initialize(redis_url=tls_url)
            assert torch.equal(run_graph("over-tls", 2), torch.full((128, 128), 4.0 * 128))
            assert proxy.accepted >= 2  # this requester and the worker came through TLS
            with pytest.raises(ConnectionFailed, match="certificate verify failed"):   # no CA: refused
                R.initialize(redis_url=tls_url.split("?")[0])
        finally:
            pool.stop_all()
    finally:
        proxy.close()


def test_a_token_that_is_a_secret_is_never_printed(server, workers, capsys):
    workers.start(1)
    jwt = "eyJhbGciOiJIUzI1NiJ9." + secrets.token_urlsafe(225) + ".signature"
    session = R.initialize(token=jwt, redis_url=server.url)
    assert jwt not in session.token and len(session.token) < 64
    R.Graph(name="jwt-graph")
    x = R.t(torch.zeros(80, 80))
    R.inv(x).persist_op("bad")
    R.activate()
    R.execute()
    with pytest.raises(R.GraphFailedError) as failed:
        R.track_progress(progress_bar=False, timeout=120)
    with pytest.raises(R.UnknownPersistName) as unknown:
        R.fetch_persisting_op("nosuch")
    shown = str(failed.value) + str(unknown.value) + "".join(capsys.readouterr())
    result = ravop("graphs", "--redis", server.url, "--token", jwt)
    shown += result.stdout + result.stderr + "".join(workers.log(n) for n in workers.procs)
    client = redis.Redis.from_url(server.url)
    shown += repr([f for _, f in client.xrange(DEAD_LETTER)]) + repr(list(client.scan_iter(match="ravop:*")))
    assert "jwt-graph" in shown and jwt not in shown and jwt[20:60] not in shown
    R.flush()
    client.close()


def test_a_token_user_gets_the_server_limit_before_writing(server, users):
    """A token user may not read the server's settings (CONFIG), yet an upload over maxmemory is refused
    with the numbers before anything is written (they come from INFO)."""
    names, urls, _ = users
    admin = redis.Redis.from_url(server.url)
    old = admin.config_get("maxmemory")["maxmemory"]
    admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) + 4 * 2**20)
    try:
        R.initialize(redis_url=urls["b"])
        R.Graph(name="too-big")
        (R.t(torch.zeros(2**21)) + 1).persist_op("y")  # 8 MiB
        with pytest.raises(R.StoreLimitError, match=r"the graph's constants need 8\.0 MiB .* maxmemory"):
            R.activate()
    finally:
        admin.config_set("maxmemory", old)
    assert not list(admin.scan_iter(match=f"ravop:{names['b']}:*"))
    admin.close()


def test_training_runs_under_acl_users(server, users):
    """A fit (a training loop: checkpoints, progress, persisted losses, released inputs) as a token user, on a
    worker user: everything the protocol writes and deletes is within their rules."""
    names, urls, pool = users
    session = R.initialize(redis_url=urls["a"])
    X = train_small_model()
    assert R.fetch_persisting_op("prediction").shape == (len(X), 1)
    assert R.fetch_persisting_op("training_loss_epoch_2_batch_3").numel() == 1
    keys = session.keys()
    admin = redis.Redis.from_url(server.url)
    assert not list(admin.scan_iter(match=keys.checkpoint("*")))   # the worker deleted its checkpoint
    admin.close()
    [worker] = pool.procs
    assert "Error" not in pool.log(worker)
    status = json.loads(ravop("status", "--redis", urls["a"], "--json").stdout)   # heartbeats got through
    assert [w["device"] for w in status["workers"] if w["name"] == worker] == ["cpu"]
