"""Federated analytics beyond means: quantiles, histograms, secure aggregation and differential privacy.

Three offices keep private CSVs and run data providers (here the embedded default's workers, given the files
with R.initialize(data=...)). The requester asks the median and deciles of age (merged KLL sketches, within
0.7% in rank), a histogram of salary (bins of fewer than k people suppressed), and, with "secure": true, the mean
and standard deviation of age, which the providers send masked so that the store sees only their sum.

Then two clinics that set a privacy budget (`ravop-worker --data clinic.csv --epsilon-budget 1`) answer a
differentially private query, which spends epsilon 0.6 of each; a second one asking 0.6 more is refused, naming
what remains. The script checks each answer against numpy, which it can only do because it wrote the files.
"""
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import ravop as R
from ravop.core.errors import GraphFailedError
from ravop.store.federated_schema import live_providers


def write_csv(path, columns):
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(list(columns))
        out.writerows(zip(*columns.values()))
    return columns


def office(path, seed, rows):
    rng = np.random.default_rng(seed)
    return write_csv(path, {"age": rng.integers(18, 75, rows), "salary": rng.lognormal(1, 0.4, rows).round(2)})


def clinic(path, seed, rows):
    rng = np.random.default_rng(seed)
    return write_csv(path, {"visits": rng.poisson(3, rows).clip(0, 20)})


def run(name, rules, record):
    """Record the statistics `record()` returns on a new federated graph, run it, fetch them."""
    R.Graph(name=name, approach="federated", rules=json.dumps(rules))
    ops = record()
    for persist, op in ops.items():
        op.persist_op(persist)
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    return {persist: R.fetch_persisting_op(persist) for persist in ops}


def main():
    with tempfile.TemporaryDirectory(prefix="federated-private-example-") as folder:   # the providers' CSVs go with the run
        run_example(Path(folder))


def run_example(folder):
    offices = [office(folder / f"office_{i}.csv", i, rows) for i, rows in enumerate((3000, 2000, 4000))]
    session = R.initialize(data=[str(folder / f"office_{i}.csv") for i in range(3)])
    R.flush()
    ages = np.concatenate([o["age"] for o in offices]).astype(float)
    salaries = np.concatenate([o["salary"] for o in offices])

    deciles = [i / 10 for i in range(1, 10)]
    rules = {"rules": {"age": {"min": 18, "max": 80}, "salary": {"min": 0, "max": 10}}, "max_clients": 3}
    got = run("quantiles", rules,
              lambda: {"median": R.federated_median(), "deciles": R.federated_quantile(deciles),
                       "salary": R.federated_histogram(bins=10)})
    # ages are whole years: a value's rank is the interval [share below it, share up to it]
    errors = [max(np.mean(ages < v) - q, q - np.mean(ages <= v), 0.0)
              for v, q in zip([got["median"]["age"]] + got["deciles"]["age"], [0.5] + deciles)]
    print(f"median age: {got['median']['age']:g} (numpy {np.median(ages):g})")
    print(f"max rank error = {max(errors):.4f}")
    want, _ = np.histogram(salaries[salaries <= 10], np.linspace(0, 10, 11))
    print(f"salary histogram: {got['salary']['salary']['counts']} (numpy {want.tolist()}; None: fewer than k)")

    got = run("secure", {"rules": {"age": {"min": 18, "max": 80}}, "max_clients": 3, "secure": True},
              lambda: {"mean": R.federated_mean(), "std": R.federated_standard_deviation()})
    print(f"secure mean age {got['mean']['age']:.6f}, std {got['std']['age']:.6f} "
          f"(numpy {ages.mean():.6f}, {ages.std():.6f})")

    clinics = [clinic(folder / f"clinic_{i}.csv", 10 + i, 5000) for i in range(2)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    providers = [subprocess.Popen([sys.executable, "-m", "worker", "--redis", session.url, "--name", f"clinic-{i}",
                                   "--data", str(folder / f"clinic_{i}.csv"), "--epsilon-budget", "1"], env=env)
                 for i in range(2)]
    try:
        while sum(name.startswith("clinic") for name in live_providers(session.client)) < 2:
            time.sleep(0.1)   # each reads its file, then advertises its columns
        rules = {"rules": {"visits": {"min": 0, "max": 20}}, "max_clients": 2, "privacy": {"epsilon": 0.6}}
        got = run("private", rules, lambda: {"mean": R.federated_mean(), "hist": R.federated_histogram(bins=5)})
        visits = np.concatenate([c["visits"] for c in clinics])
        print(f"private mean visits {got['mean']['visits']:.3f} (numpy {visits.mean():.3f}, epsilon 0.6)")
        try:
            run("private again", rules, lambda: {"mean": R.federated_mean()})
        except GraphFailedError as exc:
            print(f"refused: {str(exc).splitlines()[0][:200]}")
    finally:
        for provider in providers:
            provider.terminate()
            provider.wait()


if __name__ == "__main__":
    main()
