"""Federated analytics: the mean, variance and standard deviation of data that never leaves its providers.

Two offices each keep a private CSV. Each runs a data provider (here: the embedded default's two workers,
given the files with R.initialize(data=...); on a cluster: `ravop-worker --redis URL --data office.csv`).
The requester only names columns and ranges; each provider reduces its own rows to partial statistics, and
the requester receives the exact statistics of the union. The script checks them against numpy, which it can
only do because it wrote the files itself.
"""
import csv
import json
import tempfile
from pathlib import Path

import numpy as np

import ravop as R

RULES = {"age": {"min": 18, "max": 80}, "salary": {"min": 1, "max": 5}, "bonus": {"min": 0, "max": 10},
         "fund": {}}


def write_office(path, seed, rows):
    """A CSV of made-up employees; `name` is text and `ssn` is not in the rules: neither is ever used."""
    rng = np.random.default_rng(seed)
    columns = {"age": rng.integers(16, 90, rows), "salary": rng.uniform(0, 6, rows).round(2),
               "bonus": rng.uniform(-1, 12, rows).round(1), "fund": rng.normal(100, 10, rows).round(2),
               "ssn": rng.integers(10**8, 10**9, rows)}
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["name", *columns])
        for i in range(rows):
            out.writerow([f"employee-{seed}-{i}", *(columns[c][i] for c in columns)])
    return columns


def numpy_reference(offices, statistic):
    result = {}
    for column, rule in RULES.items():
        values = np.concatenate([office[column] for office in offices]).astype(np.float64)
        values = values[(values >= rule.get("min", -np.inf)) & (values <= rule.get("max", np.inf))]
        result[column] = getattr(values, statistic)()
    return result


def main():
    with tempfile.TemporaryDirectory(prefix="federated-example-") as folder:   # the providers' CSVs go with the run
        run_example(Path(folder))


def run_example(folder):
    offices = [write_office(folder / "office_a.csv", 1, 300), write_office(folder / "office_b.csv", 2, 200)]

    R.initialize(data=[str(folder / "office_a.csv"), str(folder / "office_b.csv")])
    R.flush()
    R.Graph(name="Office Data", approach="federated",
            rules=json.dumps({"rules": RULES, "max_clients": 2}))
    mean = R.federated_mean()
    variance = R.federated_variance()
    std = R.federated_standard_deviation()
    mean.persist_op(name="mean")
    variance.persist_op(name="variance")
    std.persist_op(name="std")
    print(R.activate())
    R.execute()
    R.track_progress()

    difference = 0.0
    for name, statistic in (("mean", "mean"), ("variance", "var"), ("std", "std")):
        result = R.fetch_persisting_op(op_name=name)
        print(f"{name}: " + ", ".join(f"{column} {value:.4f}" for column, value in result.items()))
        reference = numpy_reference(offices, statistic)
        difference = max(difference, *(abs(result[c] - reference[c]) for c in RULES))
    print(f"max |federated - numpy| = {difference:.3g}")


if __name__ == "__main__":
    main()
