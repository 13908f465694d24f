"""Differentially private federated statistics on real `ravop-worker --data --epsilon-budget` providers: noisy
releases near numpy, a ledger beside the data that survives a restart, and queries refused once it is spent."""
import json
import subprocess
import sys

import numpy as np
import pytest

import ravop as R
from ravop.core.errors import GraphFailedError, GraphStateError
from ravop.federated.column_rules import parse_rules
from ravop.federated.privacy import release

from worker.provider.privacy_ledger import BudgetExhausted, PrivacyLedger

from conftest import Workers
from test_federated import kept, write_csv

RULES = {"age": {"min": 0, "max": 100}, "score": {"min": 0, "max": 10}}
ROWS = (6000, 4000)
BUDGET = 3.5


def make_table(seed, rows):
    rng = np.random.default_rng(seed)
    return {"age": np.round(rng.uniform(0, 100, rows), 6), "score": np.round(rng.normal(5, 2, rows), 6)}


@pytest.fixture(scope="module")
def setup(server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("private-providers")
    pool = Workers(server.url, tmp_path_factory.mktemp("private-logs"))
    tables, paths, names = [], [], []
    for i, rows in enumerate(ROWS):
        tables.append(make_table(20 + i, rows))
        paths.append(folder / f"p{i}.csv")
        write_csv(paths[-1], tables[-1])
        names += pool.start(1, extra=["--data", str(paths[-1]), "--min-group-size", "5", "--epsilon-budget",
                                      str(BUDGET)], prefix=f"dp{i}")
    yield pool, tables, paths, names
    pool.stop_all()


def run(rules, record, timeout=120):
    R.Graph(name="private", approach="federated", rules=json.dumps(rules))
    for name, op in record().items():
        op.persist_op(name)
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=timeout)


def ledger(path):
    return json.loads(path.with_name(path.name + ".privacy-ledger.json").read_text())


# ------------------------------------------------------------------------------------------------ pure parts

@pytest.mark.parametrize("privacy, message", [
    ({"epsilon": 0}, "epsilon must be > 0"), ({"epsilon": "1"}, "finite number"), ({"delta": 0.1}, "object"),
    ({"epsilon": 1, "delta": 1}, "delta must be in"), ({"epsilon": 1, "rho": 1}, "object"),
])
def test_malformed_privacy_is_refused(privacy, message):
    with pytest.raises(ValueError, match=message):
        parse_rules({"rules": RULES, "privacy": privacy})


def test_privacy_needs_bounded_rules():
    with pytest.raises(ValueError, match="column\\(s\\) 'fund' lack one"):
        parse_rules({"rules": {**RULES, "fund": {"min": 0}}, "privacy": {"epsilon": 1}})


def test_noise_has_the_calibrated_spread():
    """Laplace of scale sensitivity / epsilon-share: its mean absolute deviation is that scale."""
    draws = np.array(release([([0.0] * 20000, 4.0), ([0.0], 1.0)], epsilon=2.0, delta=0)[0])
    assert np.abs(draws).mean() == pytest.approx(4.0 / 1.0, rel=0.05)   # epsilon 2 split over 2 releases
    gaussian = np.array(release([([0.0] * 20000, 1.0)], epsilon=0.5, delta=1e-6)[0])
    assert 7 < gaussian.std() < 11   # OpenDP's calibration is tighter than the classic sqrt(2 ln(1.25/d))/e = 10.6


# ------------------------------------------------------------------------------------------ on real providers

def test_private_statistics_are_near_numpy_and_charge_the_ledger(engine, setup):
    pool, tables, paths, names = setup
    run({"rules": RULES, "max_clients": 2, "privacy": {"epsilon": 1.0}},
        lambda: {"mean": R.federated_mean(), "std": R.federated_standard_deviation(), "count": R.federated_count(),
                 "hist": R.federated_histogram(bins=5)})
    for column, rule in RULES.items():
        values = kept(np.concatenate([t[column] for t in tables]), rule)
        mean, std = R.fetch_persisting_op("mean")[column], R.fetch_persisting_op("std")[column]
        assert mean != values.mean() and mean == pytest.approx(values.mean(), abs=0.02 * rule["max"])
        assert std == pytest.approx(values.std(), abs=0.05 * rule["max"])
        assert R.fetch_persisting_op("count")[column] == pytest.approx(values.size, abs=200)
        want, _ = np.histogram(values, np.linspace(rule["min"], rule["max"], 6))
        got = R.fetch_persisting_op("hist")[column]["counts"]
        assert all(c is None or abs(c - w) < 200 for c, w in zip(got, want)) and got != want.tolist()
    for path in paths:
        saved = ledger(path)
        assert (saved["budget"], saved["spent"]) == (BUDGET, 1.0) and saved["dataset"] == [str(path.resolve())]


def test_private_and_secure_together(engine, setup):
    """Each provider adds its noise, then masks: the requester reads only the noisy sum."""
    pool, tables, paths, names = setup
    run({"rules": RULES, "max_clients": 2, "privacy": {"epsilon": 0.5}, "secure": True},
        lambda: {"mean": R.federated_mean(), "hist": R.federated_histogram(bins=4)})
    for column, rule in RULES.items():
        values = kept(np.concatenate([t[column] for t in tables]), rule)
        assert R.fetch_persisting_op("mean")[column] == pytest.approx(values.mean(), abs=0.03 * rule["max"])
        want, _ = np.histogram(values, np.linspace(rule["min"], rule["max"], 5))
        assert all(abs(c - w) < 300 for c, w in zip(R.fetch_persisting_op("hist")[column]["counts"], want))
    assert all(ledger(path)["spent"] == 1.5 for path in paths)


def test_a_spent_budget_refuses_queries_across_a_restart(engine, setup):
    pool, tables, paths, names = setup
    record = lambda: {"mean": R.federated_mean()}   # noqa: E731
    run({"rules": RULES, "max_clients": 2, "privacy": {"epsilon": 1.5, "delta": 1e-6}}, record)
    assert all(ledger(path)["spent"] == 3.0 for path in paths)
    pool.terminate(names[0])
    names[0], = pool.start(1, extra=["--data", str(paths[0]), "--epsilon-budget", str(BUDGET)], prefix="dp0")
    with pytest.raises(GraphFailedError, match="asks epsilon 1 and 0.5 of 3.5 remains"):
        run({"rules": RULES, "max_clients": 2, "privacy": {"epsilon": 1.0}}, record)
    assert ledger(paths[0])["spent"] == 3.0   # a refused query spends nothing
    run({"rules": RULES, "max_clients": 2, "privacy": {"epsilon": 0.5}}, record)
    assert all(ledger(path)["spent"] == 3.5 for path in paths)


def test_a_provider_with_a_budget_answers_no_plain_query(engine, setup):
    with pytest.raises(GraphFailedError, match="answers only queries with \"privacy\""):
        run({"rules": RULES, "max_clients": 2}, lambda: {"mean": R.federated_mean()})


def test_extremes_and_quantiles_are_not_released_under_privacy(engine, setup):
    for record in (R.federated_min, R.federated_median):
        R.Graph(name="private", approach="federated", rules=json.dumps({"rules": RULES, "privacy": {"epsilon": 1}}))
        record().persist_op("x")
        with pytest.raises(GraphStateError, match="under which (min|quantile) .* is not released"):
            R.activate()


def test_the_ledger_persists_refuses_and_is_never_silently_replaced(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("x\n1\n")
    book = PrivacyLedger.beside([data], 2)
    book.charge(1.5, 0.0, "g1")
    with pytest.raises(BudgetExhausted, match="asks epsilon 1 and 0.5 of 2 remains"):
        book.charge(1.0, 0.0, "g2")
    again = PrivacyLedger.beside([data], 4)   # a new total; what was spent stays spent
    assert (again.spent, again.remaining, [q["graph"] for q in again.queries]) == (1.5, 2.5, ["g1"])
    book.path.write_text("{broken")
    with pytest.raises(ValueError, match="not a privacy ledger.*move it away"):
        PrivacyLedger.beside([data], 2)
    with pytest.raises(ValueError, match="budget must be > 0"):
        PrivacyLedger.beside([data], 0)


def test_a_worker_with_a_corrupt_ledger_or_no_data_exits_with_a_clear_message(server, tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("x\n1\n")
    data.with_name("d.csv.privacy-ledger.json").write_text("{broken")
    for extra, message in ((["--data", str(data)], "not a privacy ledger"), ([], "none was given")):
        done = subprocess.run([sys.executable, "-m", "worker", "--redis", server.url, "--epsilon-budget", "2", *extra],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and message in done.stderr, done.stderr
