"""Secure aggregation on real `ravop-worker --data` providers: the statistics equal numpy on the pooled data,
yet no provider's own sums reach the store in the clear (every command the server receives is watched); a
provider that drops out after the masks are set up (killed, or never answering) leaves the survivors' exact
sums released (SecAgg+), too many dropped fail the query naming them and the threshold, and a rewritten public
key is named."""
import json
import time

import numpy as np
import pytest

import ravop as R
from ravop.core.errors import GraphFailedError, GraphStateError
from ravop.federated import recovery, secure, shamir
from ravop.federated.column_rules import parse_rules
from ravop.federated.queries import Query
from ravop.store.federated_schema import FederatedScripts, reveals_key, shares_key
from ravop.store.federated_schema import public_keys, public_keys_key
from ravop.store.keys import FederatedKeys, graph_ref, worker_key
from worker.provider.data import ProviderData
from worker.provider.data_provider import Provider
from worker.provider.secure_rounds import SecureRound

from conftest import Workers
from helpers import commands_seen, wait_for
from test_federated import kept, write_csv

RULES = {"age": {"min": 18, "max": 80}, "fund": {}}
ROWS = (3000, 2000, 2500)
K = 3


def make_table(seed, rows):
    rng = np.random.default_rng(seed)
    return {"age": np.round(rng.uniform(10, 90, rows), 6), "fund": np.round(rng.normal(100, 5, rows), 6)}


@pytest.fixture(scope="module")
def pool(server, tmp_path_factory):
    pool = Workers(server.url, tmp_path_factory.mktemp("secure-logs"))
    yield pool
    pool.stop_all()


@pytest.fixture(scope="module")
def setup(pool, tmp_path_factory):
    folder = tmp_path_factory.mktemp("secure-providers")
    tables, paths = {}, []
    for i, rows in enumerate(ROWS):
        table = make_table(30 + i, rows)
        paths.append(folder / f"s{i}.csv")
        write_csv(paths[-1], table)
        [name] = pool.start(1, extra=["--data", str(paths[-1]), "--min-group-size", str(K)], prefix=f"s{i}")
        tables[name] = (table, paths[-1])
    return tables


def run(rules, record, timeout=120):
    R.Graph(name="secure", approach="federated", rules=json.dumps(rules))
    for name, op in record().items():
        op.persist_op(name)
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=timeout)


STATISTICS = ("mean", "variance", "standard_deviation", "count")


def record_all():
    return {**{name: getattr(R, f"federated_{name}")() for name in STATISTICS},
            "hist": R.federated_histogram(bins=6, range=(0, 120))}


# ------------------------------------------------------------------------------------------------ pure parts

def test_masks_cancel_only_in_the_sum_over_all_providers():
    names = ["a", "b", "c"]
    layout = secure.kinds(2, [3])   # 2 columns: count, sum, squares, 3 bins
    keys = {name: secure.MaskingKey() for name in names}
    publics = {name: key.public() for name, key in keys.items()}
    plain = {name: secure.encode(np.random.default_rng(i).integers(-10**6, 10**6, len(layout)), layout)
             for i, name in enumerate(names)}
    masked = {name: keys[name].mask(plain[name], layout, name, publics, "graph") for name in names}
    assert secure.add(masked.values(), layout) == secure.add(plain.values(), layout)
    assert secure.add([masked["a"], masked["b"]], layout) != secure.add([plain["a"], plain["b"]], layout)
    assert all(m != p for name in names for m, p in zip(masked[name], plain[name]))
    assert secure.unpack(secure.pack(masked["a"], layout), layout) == masked["a"]
    assert secure.decode(secure.encode([-2, 1e9, -0.25], "nww"), "nww") == [-2, 1e9, -0.25]
    with pytest.raises(ValueError, match="not an X25519 key"):
        keys["a"].mask(plain["a"], layout, "a", {"b": "bm90IGEga2V5"}, "graph")
    with pytest.raises(ValueError, match="holds 16 bytes, not 24"):
        secure.unpack(secure.pack([1], "w"), "nw")


@pytest.mark.parametrize("rules, message", [({"rules": RULES, "secure": 1}, "true or false"),
                                            ({"rules": RULES, "secure": True}, "max_clients >= 2")])
def test_secure_rules_are_checked(rules, message):
    with pytest.raises(ValueError, match=message):
        parse_rules(rules)


def test_shamir_shares_give_the_secret_back_from_t_of_n_only():
    secret = shamir.random_secret()
    shares = shamir.split(secret, 5, 4)
    assert shamir.combine({x: shares[x] for x in (1, 3, 4, 5)}) == secret
    assert shamir.combine(shares) == secret
    assert shamir.combine({x: shares[x] for x in (1, 3, 4)}) != secret
    assert recovery.threshold(3) == 2 and recovery.threshold(4) == 3 and recovery.threshold(6) == 4
    with pytest.raises(ValueError, match="distinct nonzero x"):
        shamir.combine({0: 1})


def test_the_survivors_sum_is_rebuilt_from_t_reveals_and_a_tampered_share_is_named():
    """In process, the rounds of four providers of which one drops after sending its shares."""
    names, context, layout = ["a", "b", "c", "d"], "token/graph", secure.kinds(1, [2])
    secrets = {name: recovery.ProviderSecrets() for name in names}
    publics = {name: s.public() for name, s in secrets.items()}
    sent = {name: secrets[name].shares(name, publics, context) for name in names}
    plain = {name: secure.encode([i + 5, 1.5 * i - 2, 3.25, i, 1], layout) for i, name in enumerate(names)}
    survivors = ["a", "b", "d"]
    digests = {name: secure.key_digest(public) for name, public in publics.items()}
    contributions = {name: {"keys": digests, "seed": recovery.commitment(secrets[name].seed, name, context)}
                     for name in survivors}
    total = secure.add([secrets[name].masked(plain[name], layout, name, publics, context) for name in survivors],
                       layout)
    reveals = {name: secrets[name].reveal(name, publics, sent, survivors, context) for name in survivors}
    assert all(set(r[recovery.KEY]) == {"c"} and set(r[recovery.SEED]) == set(survivors) for r in reveals.values())
    want = secure.add([plain[name] for name in survivors], layout)
    assert total != want   # the dropped provider's masks and the self-masks are still on
    assert recovery.remove_masks(total, layout, contributions, publics, reveals, context) == want
    with pytest.raises(ValueError, match="2 of the 3 surviving providers revealed their shares, fewer than the "
                                         "threshold t=3 of 4"):
        recovery.remove_masks(total, layout, contributions, publics, {n: reveals[n] for n in ("a", "b")}, context)
    forged = json.loads(json.dumps(reveals))
    forged["b"][recovery.KEY]["c"] = forged["a"][recovery.KEY]["c"]
    with pytest.raises(secure.TamperedAggregate, match="masking key of dropped provider c rebuilt from the revealed "
                                                       "shares is not the one it published"):
        recovery.remove_masks(total, layout, contributions, publics, forged, context)
    with pytest.raises(secure.TamperedAggregate, match="the public key of provider c in the store is not the one the "
                                                       "providers masked with"):
        recovery.remove_masks(total, layout, contributions, {**publics, "c": publics["a"]}, reveals, context)
    forged = json.loads(json.dumps(reveals))
    forged["d"][recovery.SEED]["a"] = forged["a"][recovery.SEED]["a"]
    with pytest.raises(secure.TamperedAggregate, match="self-mask seed of provider a rebuilt"):
        recovery.remove_masks(total, layout, contributions, publics, forged, context)
    pinned = {name: {**contributions[name], "public": digests[name]} for name in survivors}
    secure.check_keys(pinned)
    pinned["b"]["keys"] = {**digests, "d": secure.key_digest(recovery.ProviderSecrets().public())}   # b read a forgery
    with pytest.raises(secure.TamperedAggregate, match="the public key of provider d was rewritten after it "
                                                       "registered: provider b masked with a key d never published"):
        secure.check_keys(pinned)
    sent["c"]["b"] = sent["c"]["a"]   # a share rewritten in the store
    with pytest.raises(recovery.ShareError, match="the shares provider c sent to provider b do not decrypt"):
        secrets["b"].reveal("b", publics, sent, survivors, context)


# ------------------------------------------------------------------------------------------ on real providers

def test_secure_statistics_equal_numpy_and_no_partial_is_in_the_clear(engine, setup, server, client):
    """Every command the server receives is watched: each provider's masked sums differ from its own sums in
    every element, even their sum differs (self-masks) until the survivors' reveals take the masks off."""
    with commands_seen(server.url) as seen:
        run({"rules": RULES, "max_clients": 3, "secure": True}, record_all)
    for column, rule in RULES.items():
        values = kept(np.concatenate([table[column] for table, _ in setup.values()]), rule)
        got = {name: R.fetch_persisting_op(name)[column] for name in STATISTICS}
        assert got["count"] == values.size
        assert got["mean"] == pytest.approx(values.mean(), rel=1e-9)
        assert got["variance"] == pytest.approx(values.var(), rel=1e-7)
        assert got["standard_deviation"] == pytest.approx(values.std(), rel=1e-7)
        want, _ = np.histogram(values, np.linspace(0, 120, 7))
        assert R.fetch_persisting_op("hist")[column]["counts"] == [c if c == 0 or c >= K else None for c in want]
    # each provider's own sums, as it computes them, and what reached the server
    rules = parse_rules({"rules": RULES, "max_clients": 3, "secure": True})
    queries = [Query("histogram", bins=6, range=(0.0, 120.0))]
    own = {name: Provider(client, name, ProviderData.load([path]), K).secure_sums(rules, queries)
           for name, (_, path) in setup.items()}
    layout = next(iter(own.values()))[1]["layout"]
    own = {name: residues for name, (residues, _) in own.items()}
    sent = {part["secure"]: part for command in seen if "EVALSHA" in command.upper()   # a NOSCRIPT retry repeats
            for part in _json_args(command) if isinstance(part.get("secure"), str)}.values()
    assert len(sent) == 3 and not any("mean" in part or "age" in part.get("withheld", {}) for part in sent)
    vectors = [secure.unpack(part["secure"], layout) for part in sent]
    for vector in vectors:
        for plain in own.values():
            assert not any(v == p for v, p in zip(vector, plain))
    keys = engine.keys()
    stored = {name.decode(): json.loads(data) for name, data in client.hgetall(FederatedKeys(keys).partials).items()}
    reveals = {name.decode(): json.loads(data) for name, data in client.hgetall(reveals_key(keys)).items()}
    assert sorted(part["secure"] for part in sent) == sorted(part["secure"] for part in stored.values())
    assert len(reveals) == recovery.threshold(3) == 2   # the t-th reveal ends the graph
    assert not any(reveal[recovery.KEY] for reveal in reveals.values())   # nobody dropped
    total = secure.add(vectors, layout)
    assert total != secure.add(own.values(), layout)
    publics = public_keys(client, keys)
    assert recovery.remove_masks(total, layout, stored, publics, reveals, graph_ref(keys)) == secure.add(own.values(),
                                                                                                         layout)


def stored_bytes(client, keys):
    """What the providers wrote for one graph: their partials, public keys, shares and reveals."""
    written = 0
    for hash_key in (FederatedKeys(keys).partials, public_keys_key(keys), shares_key(keys), reveals_key(keys)):
        written += sum(len(k) + len(v) for k, v in client.hgetall(hash_key).items())
    return written


def test_secure_costs_at_most_four_times_the_plain_bytes(engine, setup, client):
    """Secure aggregation adds keys, n(n-1) encrypted shares and t reveals to the masked sums: about 3x the
    plain bytes for 3 providers and a short vector (docs/users/federated.md)."""
    run({"rules": RULES, "max_clients": 3}, record_all)
    plain = stored_bytes(client, engine.keys())
    run({"rules": RULES, "max_clients": 3, "secure": True}, record_all)
    masked = stored_bytes(client, engine.keys())
    assert plain < masked <= 4 * plain, (plain, masked)   # measured: 1,082 bytes against 3,063 (2.8x)


def _json_args(command):
    """The JSON object among a command's arguments as redis-py's MONITOR gives it (joined by spaces)."""
    if ' {"' not in command:
        return []
    return [json.JSONDecoder().raw_decode(command[command.index(' {"') + 1:])[0]]


def start_mean(max_clients):
    R.Graph(name="secure", approach="federated", rules=json.dumps({"rules": RULES, "max_clients": max_clients,
                                                                   "secure": True}))
    R.federated_mean().persist_op("mean")
    R.federated_count().persist_op("count")
    R.activate()
    R.execute()


def share_then_stop(client, keys, names):
    """Providers (in this process, with no worker heartbeat) that join, publish their keys and send their shares,
    then never send their masked sums: dropped after the masks are set up."""
    scripts, context = FederatedScripts(client), graph_ref(keys)
    secrets = {name: recovery.ProviderSecrets() for name in names}
    for name, mine in secrets.items():
        assert scripts.join(keys, name) == "joined"
        scripts.publish_key(keys, name, mine.public())
    publics = wait_for(lambda: (found := public_keys(client, keys)) and len(found) == 3 + len(names) and found,
                       "every provider's keys")
    for name, mine in secrets.items():
        assert scripts.share(keys, name, mine.shares(name, publics, context)) >= 1


def pooled(tables):
    return {column: kept(np.concatenate([table[column] for table in tables]), rule) for column, rule in RULES.items()}


def test_a_provider_never_answering_after_sending_its_shares_leaves_the_survivors_sum_released(engine, setup,
                                                                                                client):
    """Four providers, t = 3: the fourth sends its shares and never its sums; the three real ones close the
    inputs without it, reveal, and the requester gets their exact statistics."""
    start_mean(4)
    keys = engine.keys()
    share_then_stop(client, keys, ["dropout"])
    R.track_progress(progress_bar=False, timeout=60)
    with pytest.warns(UserWarning, match="the sum of 3 of 4 providers is released: provider\\(s\\) dropout "
                                         "dropped out"):
        R.fetch_persisting_op("count")
    for column, values in pooled([table for table, _ in setup.values()]).items():
        assert R.fetch_persisting_op("count")[column] == values.size
        assert R.fetch_persisting_op("mean")[column] == pytest.approx(values.mean(), rel=1e-9)
    assert client.hget(FederatedKeys(keys).clients, "dropout") == b"dropped"
    reveals = [json.loads(data) for data in client.hvals(reveals_key(keys))]
    assert len(reveals) == 3 and all(set(reveal[recovery.KEY]) == {"dropout"} and "dropout" not in reveal[recovery.SEED]
                                     for reveal in reveals)
    assert FederatedScripts(client).contribute(keys, "dropout", {"secure": "late"}, secure=True) == 0


def test_a_survivor_that_stops_before_revealing_does_not_hold_the_release_up(engine, setup, client):
    """Four providers, t = 3: the fourth (in this process, heartbeat on) sends its shares and its masked sums,
    then stops; the three real ones' reveals rebuild its seed, and the sum of all four is released."""
    start_mean(4)
    keys, context = engine.keys(), graph_ref(engine.keys())
    rules = parse_rules({"rules": RULES, "max_clients": 4, "secure": True})
    path = next(iter(setup.values()))[1].with_name("quiet.csv")
    quiet = make_table(41, 1200)
    write_csv(path, quiet)
    residues, contribution = Provider(client, "quiet", ProviderData.load([path]), K).secure_sums(rules, [], context)
    scripts, mine = FederatedScripts(client), recovery.ProviderSecrets()
    client.set(worker_key("quiet"), "cpu", ex=300)   # alive: not dropped
    try:
        assert scripts.join(keys, "quiet") == "joined"
        scripts.publish_key(keys, "quiet", mine.public())
        publics = wait_for(lambda: (found := public_keys(client, keys)) and len(found) == 4 and found, "the keys")
        scripts.share(keys, "quiet", mine.shares("quiet", publics, context))
        wait_for(lambda: client.hlen(shares_key(keys)) == 4, "every provider's shares")
        layout = contribution.pop("layout")
        assert scripts.contribute(keys, "quiet", {
            **contribution, "secure": secure.pack(mine.masked(residues, layout, "quiet", publics, context), layout),
            "public": secure.key_digest(mine.public()),
            "keys": {name: secure.key_digest(key) for name, key in publics.items()},
            "seed": recovery.commitment(mine.seed, "quiet", context)}, secure=True) == 1
        R.track_progress(progress_bar=False, timeout=60)
    finally:
        client.delete(worker_key("quiet"))
    for column, values in pooled([table for table, _ in setup.values()] + [quiet]).items():
        assert R.fetch_persisting_op("count")[column] == values.size
        assert R.fetch_persisting_op("mean")[column] == pytest.approx(values.mean(), rel=1e-9)
    assert "quiet" not in {name.decode() for name in client.hkeys(reveals_key(keys))}


def test_more_dropped_than_the_threshold_allows_fails_naming_them_and_t(engine, setup, client):
    """Five providers, t = 4: two drop after sending their shares, three survive; nothing is released."""
    start_mean(5)
    keys = engine.keys()
    share_then_stop(client, keys, ["gone-a", "gone-b"])
    with pytest.raises(GraphFailedError, match="provider\\(s\\) gone-a, gone-b dropped out of secure graph \\S+ "
                                               "after the masks were set up: 3 of 5 providers sent their sums, "
                                               "fewer than the threshold t=4 \\(up to 1 may drop\\), so no sum "
                                               "is released"):
        R.track_progress(progress_bar=False, timeout=60)
    assert client.hlen(reveals_key(keys)) == 0


def test_extremes_and_quantiles_are_not_released_under_secure(engine, setup):
    R.Graph(name="secure", approach="federated", rules=json.dumps({"rules": RULES, "max_clients": 2,
                                                                   "secure": True}))
    R.federated_max().persist_op("x")
    with pytest.raises(GraphStateError, match="\"secure\" in its rules, under which max"):
        R.activate()


def test_a_public_key_rewritten_after_registration_fails_the_query_naming_it(engine, setup, client):
    """Issue 44: a worker user may HSET a graph's public keys. It rewrites provider s0's keys once the three real
    providers published theirs, then joins as a fourth (so the others read the forged key) and sends its shares:
    s0 sees its key rewritten before it shares, or the survivors see the keys they masked with differ before
    they reveal; either way the graph fails naming s0's key, no share is revealed and nothing is released."""
    start_mean(4)
    keys = engine.keys()
    wait_for(lambda: len(public_keys(client, keys)) == 3, "the three providers' public keys")
    [victim] = [name for name in public_keys(client, keys) if name.startswith("s0")]
    mine = recovery.ProviderSecrets()
    client.hset(public_keys_key(keys), victim, recovery.ProviderSecrets().public())   # the rewrite
    scripts = FederatedScripts(client)
    assert scripts.join(keys, "attacker") == "joined"
    scripts.publish_key(keys, "attacker", mine.public())
    scripts.share(keys, "attacker", mine.shares("attacker", public_keys(client, keys), graph_ref(keys)))
    with pytest.raises(GraphFailedError, match=f"the public key of provider {victim} was rewritten after it "
                                               "registered: .*; the query is refused"):
        R.track_progress(progress_bar=False, timeout=60)
    assert client.hlen(reveals_key(keys)) == 0   # no share of any seed or key was revealed


def test_an_inconsistent_aggregate_is_refused_before_it_is_returned():
    """Masks that did not cancel (a partial rewritten) give a garbage count or sums outside the range."""
    with pytest.raises(secure.TamperedAggregate, match="column 'age' is not consistent: count 7.27e\\+17 is "
                                                      "outside \\[0, 2\\^48\\]"):
        secure.check_sums("age", 7.27e17, 0.0, 0.0, 31.0, noisy=False)
    with pytest.raises(secure.TamperedAggregate, match="column 'age' is not consistent: count -3 "):
        secure.check_sums("age", -3, 0.0, 0.0, 31.0, noisy=False)
    with pytest.raises(secure.TamperedAggregate, match="outside the column's range"):
        secure.check_sums("age", 100, 100 * 40.0, 0.0, 31.0, noisy=False)    # mean 40 from a centre 31 wide
    secure.check_sums("age", 100, 100 * 30.0, 100 * 30.0 ** 2, 31.0, noisy=False)   # at the edge: consistent
    secure.check_sums("fund", 100, 1e9, 1e12, None, noisy=False)   # an open range bounds only the count


def test_a_provider_killed_after_sending_its_shares_leaves_the_survivors_sum_released(engine, setup, pool, client):
    """A real provider process is killed once it has sent its shares (it waits for a fourth provider's, driven
    here); the two other real providers and the fourth close the inputs once its heartbeat expires, and the
    statistics are those of the three survivors. Last in the module: it kills one of its providers."""
    start_mean(4)
    keys = engine.keys()
    [(victim, _)] = [(name, entry) for name, entry in setup.items() if name.startswith("s2")]
    rules = parse_rules({"rules": RULES, "max_clients": 4, "secure": True})
    fourth = make_table(40, 1500)
    path = setup[victim][1].with_name("fourth.csv")
    write_csv(path, fourth)
    residues, contribution = Provider(client, "fourth", ProviderData.load([path]), K).secure_sums(
        rules, [], graph_ref(keys))
    scripts = FederatedScripts(client)
    assert scripts.join(keys, "fourth") == "joined"
    client.set(worker_key("fourth"), "cpu", ex=300)   # its heartbeat: it is not dropped
    try:
        rounds = SecureRound(client, scripts, "fourth", keys, rules, residues, contribution)
        wait_for(lambda: client.hlen(shares_key(keys)) == 3, "the three real providers' shares")
        pool.kill(victim)
        deadline = time.monotonic() + 60
        while not rounds.step():
            assert time.monotonic() < deadline, "the fourth provider's rounds did not end"
            time.sleep(0.05)
    finally:
        client.delete(worker_key("fourth"))
    R.track_progress(progress_bar=False, timeout=60)
    survivors = [table for name, (table, _) in setup.items() if name != victim] + [fourth]
    for column, values in pooled(survivors).items():
        assert R.fetch_persisting_op("count")[column] == values.size
        assert R.fetch_persisting_op("mean")[column] == pytest.approx(values.mean(), rel=1e-9)
    assert client.hget(FederatedKeys(keys).clients, victim) == b"dropped"
