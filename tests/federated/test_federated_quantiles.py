"""Federated quantiles (merged KLL sketches) and histograms (bin counts, small bins suppressed) on three real
`ravop-worker --data` provider processes, against numpy on the pooled filtered data."""
import json
import re

import numpy as np
import pytest
import torch

import ravop as R
from ravop.federated import sketches
from ravop.federated.queries import parse_query
from ravop.ops.federated_stats import federated_histogram, federated_quantile

from conftest import Workers
from example_runs import run_example
from test_federated import kept, write_csv

RULES = {"age": {"min": 18, "max": 80}, "fund": {}}
K = 3
ROWS = (9000, 4000, 7000)   # more than a sketch keeps: its compaction is exercised


def make_table(seed, rows):
    rng = np.random.default_rng(seed)
    return {"age": np.round(rng.uniform(10, 90, rows), 6), "fund": np.round(rng.lognormal(4, 1, rows), 6)}


@pytest.fixture(scope="module")
def providers(server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("quantile-providers")
    pool = Workers(server.url, tmp_path_factory.mktemp("quantile-logs"))
    tables = []
    for i, rows in enumerate(ROWS):
        table = make_table(10 + i, rows)
        write_csv(folder / f"p{i}.csv", table)
        pool.start(1, extra=["--data", str(folder / f"p{i}.csv"), "--min-group-size", str(K)], prefix=f"q{i}")
        tables.append(table)
    yield tables
    pool.stop_all()


def run(rules, record):
    R.Graph(name="quantiles", approach="federated", rules=json.dumps(rules))
    for name, op in record().items():
        op.persist_op(name)
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)


def pooled(tables, column):
    return kept(np.concatenate([t[column] for t in tables]), RULES[column])


# ------------------------------------------------------------------------------------------------ pure parts

def test_quantile_kernel_is_the_inclusive_rank():
    items, weights = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 1.0, 2.0, 4.0])
    assert federated_quantile(items, weights, (0.0, 0.125, 0.13, 0.5, 1.0)).tolist() == [1.0, 1.0, 2.0, 3.0, 4.0]


def test_histogram_kernel_sums_and_suppresses():
    counts = torch.tensor([[5.0, np.nan, 0.0, 1.0], [4.0, 7.0, 0.0, 1.0]])
    got = federated_histogram(counts, k=3)
    assert got[0] == 9 and got[2] == 0 and torch.isnan(got[1]) and torch.isnan(got[3])


def test_sketches_merge_within_their_rank_error():
    rng = np.random.default_rng(3)
    parts = [rng.normal(0, 1, 30000), rng.exponential(2, 50000), rng.uniform(-5, 5, 20000)]
    items, weights = sketches.merged_items([sketches.sketch(part) for part in parts])
    pooled_values = np.sort(np.concatenate(parts))
    q = np.linspace(0, 1, 101)
    got = federated_quantile(torch.from_numpy(items), torch.from_numpy(weights), tuple(q)).numpy()
    rank = np.searchsorted(pooled_values, got, side="right") / pooled_values.size
    assert np.abs(rank - q).max() <= sketches.rank_error()


@pytest.mark.parametrize("encoded, message", [(b"x", "base64 string"), ("!!!", "not a KLL sketch"),
                                              ("YWJjZGVmZ2hhYmNkZWZnaA==", "not a KLL sketch")])
def test_a_malformed_sketch_is_refused(encoded, message):
    with pytest.raises(ValueError, match=message):
        sketches.decode(encoded)


@pytest.mark.parametrize("call, message", [
    (lambda: R.federated_quantile(1.5), "probability in \\[0, 1\\]"),
    (lambda: R.federated_quantile([]), "non-empty list"),
    (lambda: R.federated_quantile("half"), "probability"),
    (lambda: R.federated_histogram(bins=0), "bins must be an integer"),
    (lambda: R.federated_histogram(bins=4, range=(5, 1)), "finite low < high"),
])
def test_bad_parameters_are_refused(call, message):
    R.Graph(name="bad", approach="federated", rules=json.dumps({"rules": RULES}))
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("stored", ['{"statistic": "exec"}', '{"statistic": "quantile", "q": [2]}', "{nope",
                                    '{"statistic": "histogram", "bins": 100000}'])
def test_a_hostile_query_is_refused(stored):
    with pytest.raises(ValueError):
        parse_query(stored)


# ------------------------------------------------------------------------------------------ on real providers

def test_quantiles_match_numpy_within_the_sketch_error(engine, providers):
    qs = [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99]
    run({"rules": RULES, "max_clients": 3},
        lambda: {"median": R.federated_median(), "qs": R.federated_quantile(qs)})
    median, listed = R.fetch_persisting_op("median"), R.fetch_persisting_op("qs")
    for column in RULES:
        values = np.sort(pooled(providers, column))
        assert type(median[column]) is float and len(listed[column]) == len(qs)
        for q, got in zip([0.5] + qs, [median[column]] + listed[column]):
            rank = np.searchsorted(values, got, side="right") / values.size
            assert abs(rank - q) <= sketches.rank_error(), (column, q, got, np.quantile(values, q))


def test_histograms_match_numpy_and_suppress_small_bins(engine, providers):
    run({"rules": {"age": RULES["age"]}, "max_clients": 3}, lambda: {"own": R.federated_histogram(bins=31)})
    own = R.fetch_persisting_op("own")
    edges = np.linspace(18, 80, 32)
    want, _ = np.histogram(pooled(providers, "age"), edges)
    np.testing.assert_allclose(own["age"]["edges"], edges)
    assert own["age"]["counts"] == want.tolist()
    run({"rules": RULES, "max_clients": 3}, lambda: {"tail": R.federated_histogram(bins=40, range=(0, 1200))})
    tail = R.fetch_persisting_op("tail")
    # the lognormal's tail bins hold fewer than K values of some provider: those bins are suppressed
    edges = np.linspace(0, 1200, 41)
    each = np.array([np.histogram(kept(table["fund"], {}), edges)[0] for table in providers])
    small = ((each > 0) & (each < K)).any(0)
    assert small.any() and not small.all()
    assert tail["fund"]["counts"] == [None if s else int(c) for s, c in zip(small, each.sum(0))]


def test_a_histogram_of_an_unbounded_rule_needs_a_range(engine, providers):
    R.Graph(name="unbounded", approach="federated", rules=json.dumps({"rules": RULES}))
    R.federated_histogram(bins=4).persist_op("h")
    with pytest.raises(ValueError, match="column 'fund' to give both min and max"):
        R.activate()


def test_the_private_example_matches_numpy():
    out = run_example("federated_analytics_private.py", 1)   # the providers' CSVs go with the run: $TMPDIR empty
    assert float(re.search(r"^max rank error = ([0-9.]+)$", out, re.MULTILINE).group(1)) <= sketches.rank_error()
    mean, std, want_mean, want_std = map(float, re.search(
        r"^secure mean age ([0-9.]+), std ([0-9.]+) \(numpy ([0-9.]+), ([0-9.]+)\)$", out, re.MULTILINE).groups())
    assert (mean, std) == (want_mean, want_std)
    got, want = map(float, re.search(r"^private mean visits ([0-9.]+) \(numpy ([0-9.]+)", out, re.MULTILINE).groups())
    assert got == pytest.approx(want, abs=0.2)
    assert re.search(r"^refused: .*asks epsilon 0.6 and 0.4 of 1 remains$", out, re.MULTILINE)
