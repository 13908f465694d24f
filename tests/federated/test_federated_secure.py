"""Secure aggregation on real `ravop-worker --data` providers: the statistics equal numpy on the pooled data,
yet no provider's own sums reach the store in the clear (every command the server receives is watched), and a
provider that drops out after the key exchange makes the query fail with its name instead of a wrong answer."""
import json

import numpy as np
import pytest

import ravop as R
from ravop.core.errors import GraphStateError
from ravop.federated import secure
from ravop.federated.column_rules import parse_rules
from ravop.federated.queries import Query
from ravop.store.federated_schema import FederatedScripts
from ravop.store.federated_schema import public_keys, public_keys_key
from ravop.store.keys import FederatedKeys
from worker.provider.data import ProviderData
from worker.provider.data_provider import Provider

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
def setup(server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("secure-providers")
    pool = Workers(server.url, tmp_path_factory.mktemp("secure-logs"))
    tables, paths = {}, []
    for i, rows in enumerate(ROWS):
        table = make_table(30 + i, rows)
        paths.append(folder / f"s{i}.csv")
        write_csv(paths[-1], table)
        [name] = pool.start(1, extra=["--data", str(paths[-1]), "--min-group-size", str(K)], prefix=f"s{i}")
        tables[name] = (table, paths[-1])
    yield tables
    pool.stop_all()


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


# ------------------------------------------------------------------------------------------ on real providers

def test_secure_statistics_equal_numpy_and_no_partial_is_in_the_clear(engine, setup, server, client):
    """Every command the server receives is watched: each provider's masked sums differ from its own sums in
    every element, while all of them add up to the pooled sums."""
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
    sent = {arg: json.loads(arg) for command in seen if "EVALSHA" in command.upper()   # a NOSCRIPT retry repeats
            for arg in _json_args(command) if '"secure": "' in arg}.values()
    assert len(sent) == 3 and not any("mean" in part or "age" in part.get("withheld", {}) for part in sent)
    vectors = [secure.unpack(part["secure"], layout) for part in sent]
    assert secure.add(vectors, layout) == secure.add(own.values(), layout)   # the sum, and only the sum, is stored
    for vector in vectors:
        for plain in own.values():
            assert not any(v == p for v, p in zip(vector, plain))


def stored_bytes(client, keys):
    """What the providers wrote for one graph: their partials and public keys."""
    written = sum(client.hstrlen(FederatedKeys(keys).partials, p) for p in client.hkeys(FederatedKeys(keys).partials))
    return written + sum(len(k) + len(v) for k, v in client.hgetall(public_keys_key(keys)).items())


def test_secure_costs_at_most_twice_the_plain_bytes(engine, setup, client):
    run({"rules": RULES, "max_clients": 3}, record_all)
    plain = stored_bytes(client, engine.keys())
    run({"rules": RULES, "max_clients": 3, "secure": True}, record_all)
    masked = stored_bytes(client, engine.keys())
    assert masked <= 2 * plain, (plain, masked)   # measured: 981 bytes against 1055


def _json_args(command):
    """The JSON argument that ends a command as redis-py's MONITOR gives it (its arguments joined by spaces)."""
    return [command[command.index(' {"') + 1:]] if ' {"' in command else []


def test_a_provider_dropping_out_after_the_key_exchange_fails_the_query_by_name(engine, setup, client, capsys):
    """A fourth provider joins and publishes its key, then stops: the others mask with it and send, and the
    query waits for it, naming it, instead of releasing sums whose masks do not cancel."""
    R.Graph(name="secure", approach="federated", rules=json.dumps({"rules": RULES, "max_clients": 4,
                                                                   "secure": True}))
    R.federated_mean().persist_op("mean")
    R.activate()
    R.execute()
    keys = engine.keys()
    scripts = FederatedScripts(client)
    assert scripts.join(keys, "dropout") == "joined"
    assert scripts.publish_key(keys, "dropout", secure.MaskingKey().public()) >= 1
    fed = FederatedKeys(keys)
    wait_for(lambda: client.hlen(fed.partials) == 3, "the three live providers' masked partials")
    with pytest.raises(TimeoutError, match="provider\\(s\\) dropout joined graph 'secure' and stopped before"):
        R.track_progress(progress_bar=False, timeout=3)   # it waits for the fourth, naming it
    assert client.hlen(fed.partials) == 3 and len(public_keys(client, keys)) == 4
    with pytest.raises(R.NotComputedError):
        R.fetch_persisting_op("mean")


def test_extremes_and_quantiles_are_not_released_under_secure(engine, setup):
    R.Graph(name="secure", approach="federated", rules=json.dumps({"rules": RULES, "max_clients": 2,
                                                                   "secure": True}))
    R.federated_max().persist_op("x")
    with pytest.raises(GraphStateError, match="\"secure\" in its rules, under which max"):
        R.activate()


def test_a_public_key_rewritten_after_registration_fails_the_query_naming_it(engine, setup, client):
    """Issue 44: a worker user may HSET a graph's public keys. It rewrites provider s0's key once the three real
    providers published theirs, then joins as a fourth (so the others mask with the forged key) and sends a
    partial: the release refuses, naming s0's key, instead of an aggregate whose masks it could undo."""
    R.Graph(name="secure", approach="federated", rules=json.dumps({"rules": RULES, "max_clients": 4,
                                                                   "secure": True}))
    R.federated_mean().persist_op("mean")
    R.activate()
    R.execute()
    keys = engine.keys()
    wait_for(lambda: len(public_keys(client, keys)) == 3, "the three providers' public keys")
    [victim] = [name for name in public_keys(client, keys) if name.startswith("s0")]
    mine = secure.MaskingKey()
    client.hset(public_keys_key(keys), victim, secure.MaskingKey().public())   # the rewrite
    scripts = FederatedScripts(client)
    assert scripts.join(keys, "attacker") == "joined"
    scripts.publish_key(keys, "attacker", mine.public())
    fed = FederatedKeys(keys)
    wait_for(lambda: client.hlen(fed.partials) == 3, "the three providers' masked partials")
    layout = secure.kinds(len(RULES), [])
    publics = public_keys(client, keys)
    scripts.contribute(keys, "attacker", {"withheld": {}, "k": K, "public": mine.public(), "keys": publics,
                                          "secure": secure.pack(mine.mask([0] * len(layout), layout, "attacker",
                                                                          publics, ""), layout)})
    R.track_progress(progress_bar=False, timeout=60)
    with pytest.raises(secure.TamperedAggregate, match=f"the public key of provider {victim} was rewritten after it "
                                                       f"registered: provider \\S+ masked with a key {victim} never "
                                                       "published; the query is refused"):
        R.fetch_persisting_op("mean")


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
