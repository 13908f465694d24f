"""Federated analytics end to end: two `ravop-worker --data` provider processes on a real server, each
holding its own CSV; statistics equal numpy on the filtered union; no value of a row ever reaches Redis;
rules, columns and provider counts that cannot work are refused clearly."""
import csv
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ravop as R
from ravop.core.errors import GraphStateError
from ravop.federated.column_rules import parse_rules
from ravop.federated.partials import merge, partial, statistic
from ravop.store import GraphKeys
from ravop.store.keys import FEDERATED_OPEN, FederatedKeys, graph_ref
from worker.provider.data import DataError, ProviderData

from conftest import Workers
from helpers import commands_seen
from example_runs import ROOT, run_example

RULES = {"age": {"min": 18, "max": 80}, "salary": {"min": 1, "max": 5}, "bonus": {"min": 0, "max": 10},
         "fund": {}}
STATISTICS = ("mean", "variance", "standard_deviation", "min", "max", "count")
K = 3  # the providers' --min-group-size


def make_table(seed, rows, secret):
    """Columns with values unique enough (6 random decimals) that a leak of one would be recognised."""
    rng = np.random.default_rng(seed)
    table = {"age": np.round(rng.uniform(10, 90, rows), 6), "salary": np.round(rng.uniform(0, 6, rows), 6),
             "bonus": np.round(rng.uniform(-2, 12, rows), 6), "fund": np.round(rng.normal(100, 5, rows), 6),
             "tenure": np.round(rng.uniform(0, 10, rows), 6), secret: np.round(rng.uniform(1e5, 1e6, rows), 6)}
    table["tenure"][:2] = [150.123457, 170.654321]  # two values >= 100: fewer than K
    return table


def write_csv(path, table, missing=()):
    names = list(table)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(names)
        for i in range(len(table[names[0]])):
            out.writerow(["" if (name, i) in missing else repr(float(table[name][i])) for name in names])


def kept(values, rule):
    values = values[~np.isnan(values)]
    return values[(values >= rule.get("min", -np.inf)) & (values <= rule.get("max", np.inf))]


def expected(tables, column, rule):
    values = kept(np.concatenate([t[column] for t in tables]), rule)
    return {"mean": values.mean(), "variance": values.var(), "standard_deviation": values.std(),
            "min": values.min(), "max": values.max(), "count": float(values.size)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("providers")
    first, second = make_table(1, 240, "ssn"), make_table(2, 170, "phone")
    second["fund"][5] = np.nan  # an empty cell: a missing value, counted by no statistic
    write_csv(folder / "first.csv", first)
    write_csv(folder / "second.csv", second, missing={("fund", 5)})
    return {"first": (folder / "first.csv", first), "second": (folder / "second.csv", second)}


@pytest.fixture(scope="module")
def providers(server, data, tmp_path_factory):
    """Two provider workers, each with its own CSV: name -> table."""
    pool = Workers(server.url, tmp_path_factory.mktemp("provider-logs"))
    names = {}
    for label, (path, table) in data.items():
        [name] = pool.start(1, extra=["--data", str(path), "--min-group-size", str(K)], prefix=label)
        names[name] = table
    yield names
    pool.stop_all()


def run_federated(rules, statistics=STATISTICS, timeout=120):
    R.Graph(name="office", approach="federated", rules=json.dumps(rules))
    for name in statistics:
        getattr(R, f"federated_{name}")().persist_op(name)
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=timeout)
    return {name: R.fetch_persisting_op(op_name=name) for name in statistics}


def contributors(client, session):
    return sorted(name.decode() for name in client.hkeys(FederatedKeys(session.keys()).clients))


# ------------------------------------------------------------------------------------------------ pure parts

def test_chan_merge_equals_numpy_on_the_union():
    rng = np.random.default_rng(0)
    values = rng.normal(3, 7, 1001)
    for cuts in ([500], [1, 2, 999], [0, 0, 1000], [333, 334]):
        merged = {"count": 0}
        for part in np.split(values, cuts):
            merged = merge(merged, partial(part))
        assert merged["count"] == values.size
        assert statistic(merged, "mean") == pytest.approx(values.mean(), rel=1e-12)
        assert statistic(merged, "variance") == pytest.approx(values.var(), rel=1e-12)
        assert statistic(merged, "standard_deviation") == pytest.approx(values.std(), rel=1e-12)
        assert (statistic(merged, "min"), statistic(merged, "max")) == (values.min(), values.max())


def test_partial_keeps_the_inclusive_range_and_drops_missing_values():
    part = partial([1.0, 2.0, np.nan, 3.0, 4.0], low=2, high=3)
    assert part == {"count": 2, "mean": 2.5, "m2": 0.5, "min": 2.0, "max": 3.0}
    assert partial([5.0], low=6) == {"count": 0}


@pytest.mark.parametrize("rules, message", [
    ("{'rules': ", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ({"rules": {}}, "at least one column"),
    ({"rules": {"age": {}}, "clients": 2}, "unknown key"),
    ({"rules": {"age": {"min": 1, "low": 0}}}, "unknown key"),
    ({"rules": {"age": {"min": "18"}}}, "finite number"),
    ({"rules": {"age": {"min": 80, "max": 18}}}, "keeps nothing"),
    ({"rules": {"age": []}}, "must be an object"),
    ({"rules": {"age": {}}, "max_clients": 0}, "max_clients must be an integer >= 1"),
    ({"rules": {"age": {}}, "max_clients": True}, "max_clients must be an integer >= 1"),
    ({"rules": {"age": {}}, "min_group_size": 0}, "min_group_size must be an integer >= 1"),
])
def test_malformed_rules_are_refused_naming_the_problem(rules, message):
    with pytest.raises(ValueError, match=message):
        R.Graph(name="bad", approach="federated", rules=rules if isinstance(rules, str) else json.dumps(rules))


def test_graph_arguments_are_checked():
    with pytest.raises(ValueError, match="approach must be 'distributed' or 'federated'"):
        R.Graph(approach="centralized")
    with pytest.raises(ValueError, match="needs rules"):
        R.Graph(approach="federated")
    with pytest.raises(ValueError, match="only to approach='federated'"):
        R.Graph(approach="distributed", rules=json.dumps({"rules": {"age": {}}}))
    with pytest.raises(ValueError, match="gpu_required"):
        R.Graph(approach="federated", gpu_required="yes", rules=json.dumps({"rules": {"age": {}}}))
    R.Graph(name="plain")
    with pytest.raises(GraphStateError, match="needs a federated graph"):
        R.federated_mean()
    assert parse_rules({"rules": {"age": {"max": 3}}}).columns == {"age": (None, 3)}


def test_provider_data_reads_numeric_columns_of_several_files(tmp_path):
    (tmp_path / "a.csv").write_text("age,name,score\n30,ann,1.5\n40,bob,\n")
    (tmp_path / "b.csv").write_text("score,age\n2.5,50\n")
    data = ProviderData.load([tmp_path / "a.csv", tmp_path / "b.csv"])
    assert data.names() == ["age", "score"]  # 'name' is text: never offered
    np.testing.assert_array_equal(data.columns["age"], [30, 40, 50])
    np.testing.assert_array_equal(data.columns["score"], [1.5, np.nan, 2.5])
    pq.write_table(pa.table({"age": pa.array([60, None], pa.int64()), "name": ["cy", "di"]}), tmp_path / "c.parquet")
    data = ProviderData.load([tmp_path / "a.csv", tmp_path / "c.parquet"])
    assert data.names() == ["age", "score"]
    np.testing.assert_array_equal(data.columns["age"], [30, 40, 60, np.nan])
    (tmp_path / "ragged.csv").write_text("age,score\n1,2\n3\n")
    with pytest.raises(DataError, match="ragged.csv:3: 1 fields"):
        ProviderData.load([tmp_path / "ragged.csv"])


def test_embedded_data_is_checked_before_anything_starts(server, tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.csv"):
        R.initialize(data=[str(tmp_path / "absent.csv")])
    (tmp_path / "a.csv").write_text("age\n1\n")
    with pytest.raises(ValueError, match="on a cluster each provider runs ravop-worker --data"):
        R.initialize(redis_url=server.url, data=[str(tmp_path / "a.csv")])


def test_worker_with_unreadable_data_exits_with_a_clear_message(server, tmp_path):
    done = subprocess.run([sys.executable, "-m", "worker", "--redis", server.url, "--data",
                           str(tmp_path / "absent.csv")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "absent.csv: cannot be read as CSV" in done.stderr


# ------------------------------------------------------------------------------------------ on real providers

def test_two_providers_equal_numpy_on_the_filtered_union(engine, providers, client):
    results = run_federated({"rules": RULES, "max_clients": 2})
    assert contributors(client, engine) == sorted(providers)
    for column, rule in RULES.items():
        want = expected(list(providers.values()), column, rule)
        for name in STATISTICS:
            got = results[name][column]
            assert type(got) is float
            assert got == pytest.approx(want[name], rel=1e-9, abs=1e-9), (name, column)
    assert set(results["mean"]) == set(RULES)  # only rule columns are ever released
    listed = R.get_my_graphs()[-1]
    assert (listed["state"], listed["progress"], listed["subgraphs"]) == ("done", 100.0, 2)


def test_one_provider_equals_numpy_on_its_own_data(engine, providers, client):
    results = run_federated({"rules": RULES, "max_clients": 1})
    [provider] = contributors(client, engine)
    for column, rule in RULES.items():
        want = expected([providers[provider]], column, rule)
        for name in STATISTICS:
            assert results[name][column] == pytest.approx(want[name], rel=1e-9, abs=1e-9), (name, column)


def test_no_row_value_and_no_other_column_reaches_redis(engine, providers, client, server):
    """Every command the server receives while the graph runs (MONITOR) and every key and value it holds
    afterwards are searched for each cell of the providers' data. Only the released extremes of the rule
    columns (each provider's min and max in range) may appear."""
    allowed = set()
    for table in providers.values():
        for column, rule in RULES.items():
            values = kept(table[column], rule)
            allowed |= {float(values.min()), float(values.max())}
    cells = {float(v) for table in providers.values() for values in table.values() for v in values
             if not np.isnan(v)} - allowed
    with commands_seen(server.url) as seen:
        run_federated({"rules": RULES, "max_clients": 2})
    assert any("federated" in c for c in seen)
    for key in client.scan_iter("*"):
        kind = client.type(key)
        value = {b"string": client.get, b"hash": client.hgetall, b"set": client.smembers,
                 b"zset": lambda k: client.zrange(k, 0, -1, withscores=True),
                 b"stream": lambda k: client.xrange(k), b"list": lambda k: client.lrange(k, 0, -1)}[kind](key)
        seen.append(f"{key!r} {value!r}")
    numbers = {float(token) for token in re.findall(r"-?\d+\.\d+(?:[eE][-+]?\d+)?", "\n".join(seen))}
    leaked = sorted(cells & numbers)
    assert not leaked, f"{len(leaked)} data values reached Redis, e.g. {leaked[:5]}"


def test_a_statistic_over_fewer_than_k_values_is_withheld(engine, providers):
    rules = {"rules": {"tenure": {"min": 100}, "fund": {}}, "max_clients": 2}
    with pytest.warns(UserWarning, match=f"'tenure'.*fewer than k={K}"):
        means = run_federated(rules, ("mean",))["mean"]
    assert set(means) == {"fund"} and "tenure" in means.withheld
    with pytest.warns(UserWarning, match="k=1000"):
        counts = run_federated({**rules, "min_group_size": 1000}, ("count",))["count"]
    assert counts == {} and set(counts.withheld) == {"tenure", "fund"}


def test_a_column_no_provider_holds_is_refused(engine, providers):
    R.Graph(name="office", approach="federated", rules=json.dumps({"rules": {"age": {}, "height": {}}}))
    R.federated_mean().persist_op("mean")
    with pytest.raises(ValueError, match="no provider holds column\\(s\\) 'height'.*age"):
        R.activate()


def test_more_providers_than_exist_waits_with_a_message_then_times_out(engine, providers, capsys):
    R.Graph(name="office", approach="federated", rules=json.dumps({"rules": RULES, "max_clients": 3}))
    R.federated_mean().persist_op("mean")
    R.activate()
    assert "max_clients is 3 but 2 connected provider(s)" in capsys.readouterr().err
    R.execute()
    with pytest.raises(TimeoutError, match="waiting for 1 more provider"):
        R.track_progress(progress_bar=False, timeout=3)
    assert "waiting for 1 more provider(s) holding age, salary, bonus, fund" in capsys.readouterr().err
    with pytest.raises(R.NotComputedError, match="not computed yet"):
        R.fetch_persisting_op("mean")


def test_only_federated_statistics_run_in_a_federated_graph(engine, providers):
    R.Graph(name="office", approach="federated", rules=json.dumps({"rules": RULES}))
    doubled = R.federated_mean() + R.federated_count()
    doubled.persist_op("doubled")
    with pytest.raises(GraphStateError, match="op 'add' was recorded at .*test_federated.py"):
        R.activate()


def test_hostile_open_graphs_fail_without_stopping_a_provider(engine, providers, client):
    keys = GraphKeys(engine.token, "hostile")
    client.hset(keys.meta, mapping={"name": "hostile", "state": "running", "max_clients": 1, "rules": "{not json",
                                    "n_ops": 1, "ops_done": 0})
    refs = ["no-slash-here", "bad token!/x", b"\xff/\xfe", graph_ref(keys)]
    client.sadd(FEDERATED_OPEN, *refs)
    deadline = time.monotonic() + 60
    while client.hget(keys.meta, "state") != b"failed" or client.scard(FEDERATED_OPEN):
        assert time.monotonic() < deadline, client.hgetall(keys.meta)
        time.sleep(0.05)
    assert b"rules is not valid JSON" in client.hget(keys.meta, "error")
    assert client.hget(keys.meta, "error_worker").decode() in providers
    results = run_federated({"rules": RULES, "max_clients": 2}, ("mean",))
    assert set(results["mean"]) == set(RULES)


def test_a_provider_that_left_before_sending_its_statistics_is_named(engine, providers, client):
    R.Graph(name="office", approach="federated", rules=json.dumps({"rules": RULES, "max_clients": 3}))
    R.federated_mean().persist_op("mean")
    R.activate()
    client.hset(FederatedKeys(engine.keys()).clients, "ghost", "joined")   # joined, then its process died
    R.execute()
    with pytest.raises(TimeoutError, match="provider\\(s\\) ghost joined graph 'office' and stopped before"):
        R.track_progress(progress_bar=False, timeout=3)

# ------------------------------------------------------------------------------ scripts, embedded default

ISSUE_SCRIPT = '''
import json
import ravop as R
R.initialize(token="office-requester")
R.flush()
R.Graph(name="Office Data", approach="federated",
        rules=json.dumps({"rules": {"age": {"min": 18, "max": 80}, "salary": {"min": 1, "max": 5},
                                    "bonus": {"min": 0, "max": 10}, "fund": {}},
                          "max_clients": 1}))
mean = R.federated_mean(); variance = R.federated_variance(); std = R.federated_standard_deviation()
mean.persist_op(name="mean"); variance.persist_op(name="variance"); std.persist_op(name="std")
R.activate(); R.execute(); R.track_progress()
print(json.dumps({name: R.fetch_persisting_op(op_name=name) for name in ("mean", "variance", "std")}))
'''


def test_the_issue_script_runs_on_embedded_providers_given_by_environment(data, tmp_path):
    """The original requester script (token= for ravenverse_token=), its providers' data in $RAVOP_DATA."""
    script = tmp_path / "office.py"
    script.write_text(ISSUE_SCRIPT)
    env = {**os.environ, "RAVOP_DATA": os.pathsep.join(str(path) for path, _ in data.values()),
           "RAVOP_MIN_GROUP_SIZE": str(K), "PYTHONPATH": str(ROOT)}
    env.pop("RAVOP_REDIS_URL", None)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(results["mean"]) == set(RULES)
    # max_clients 1: the statistics are those of whichever provider joined first
    matches = []
    for _, table in data.values():
        want = {column: expected([table], column, rule) for column, rule in RULES.items()}
        matches.append(all(results[name][column] == pytest.approx(want[column][statistic], rel=1e-9)
                           for name, statistic in (("mean", "mean"), ("variance", "variance"),
                                                   ("std", "standard_deviation")) for column in RULES))
    assert sum(matches) == 1


def test_the_example_matches_numpy():
    out = run_example("federated_analytics.py", 1)   # its providers' CSVs go with the run: its $TMPDIR stays empty
    assert re.search(r"^mean: age [0-9.]+, salary [0-9.]+, bonus [0-9.]+, fund [0-9.]+$", out, re.MULTILINE)
    difference = float(re.search(r"max \|federated - numpy\| = ([-0-9.e]+)$", out, re.MULTILINE).group(1))
    assert difference < 1e-9
