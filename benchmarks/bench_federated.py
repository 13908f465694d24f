"""Federated statistics: quantile rank error, bytes in the store and time per query, by mode.

    python benchmarks/bench_federated.py [--rows 1000000]

1. Sketches in process, --rows values split 50/30/20% over 3 providers with different distributions (what each
   provider and the requester run: `ravop.federated.sketches` and the `federated_quantile` kernel): the largest
   rank error over q = 0.001..0.999 against the exact rank in the pooled data, the sketch's bytes, the time to
   sketch, merge and read, against numpy's exact quantiles of the pooled data (which needs the data in one place).
2. End to end on the embedded default with 3 providers (Parquet files of the same --rows): the time from
   R.Graph to the fetched values and the bytes the providers wrote to the store (partials; public keys, shares
   and reveals of a secure graph) per mode: plain moments, moments + histogram (plain and secure), quantiles.
"""
import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import ravop as R
from ravop.federated import sketches
from ravop.ops.federated_stats import federated_quantile
from ravop.store.federated_schema import public_keys_key, reveals_key, shares_key
from ravop.store.keys import FederatedKeys

SHARES = (0.5, 0.3, 0.2)
QS = np.linspace(0.001, 0.999, 999)


def provider_data(rows, seed=0):
    rng = np.random.default_rng(seed)
    sizes = [int(rows * share) for share in SHARES]
    return [rng.normal(50, 10, sizes[0]), rng.lognormal(3.5, 0.6, sizes[1]), rng.uniform(0, 100, sizes[2])]


def in_process(rows):
    parts = provider_data(rows)
    start = time.perf_counter()
    encoded = [sketches.sketch(part) for part in parts]
    sketched = time.perf_counter() - start
    start = time.perf_counter()
    items, weights = sketches.merged_items(encoded)
    found = federated_quantile(torch.from_numpy(items), torch.from_numpy(weights), tuple(QS)).numpy()
    merged = time.perf_counter() - start
    pooled = np.sort(np.concatenate(parts))
    rank = np.searchsorted(pooled, found, side="right") / pooled.size
    start = time.perf_counter()
    np.quantile(np.concatenate(parts), QS)
    exact = time.perf_counter() - start
    return {"rows": rows, "providers": len(parts), "max_rank_error": float(np.abs(rank - QS).max()),
            "stated_rank_error_99pct": sketches.rank_error(),
            "sketch_bytes_per_provider": [len(e) for e in encoded], "sketch_seconds_all_providers": sketched,
            "merge_and_quantiles_seconds": merged, "numpy_exact_quantiles_seconds": exact}


MODES = {
    "plain moments": ({}, lambda: {s: getattr(R, f"federated_{s}")() for s in ("mean", "variance", "count")}),
    "plain moments + histogram(20)": ({}, lambda: {"mean": R.federated_mean(), "variance": R.federated_variance(),
                                                   "count": R.federated_count(),
                                                   "hist": R.federated_histogram(bins=20)}),
    "secure moments + histogram(20)": ({"secure": True}, lambda: {"mean": R.federated_mean(),
                                                                 "variance": R.federated_variance(),
                                                                 "count": R.federated_count(),
                                                                 "hist": R.federated_histogram(bins=20)}),
    "quantiles (median + 9 deciles)": ({}, lambda: {"median": R.federated_median(),
                                                    "deciles": R.federated_quantile([i / 10 for i in range(1, 10)])}),
}


def end_to_end(rows, folder):
    paths = []
    for i, part in enumerate(provider_data(rows, seed=1)):
        paths.append(str(Path(folder) / f"p{i}.parquet"))
        pq.write_table(pa.table({"x": part}), paths[-1])
    session = R.initialize(token="bench-federated", data=paths)
    rules = {"rules": {"x": {"min": 0, "max": 200}}, "max_clients": 3}
    results = {}
    for mode, (extra, record) in MODES.items():
        start = time.perf_counter()
        R.Graph(name=mode, approach="federated", rules=json.dumps({**rules, **extra}))
        ops = record()
        for name, op in ops.items():
            op.persist_op(name)
        R.activate()
        R.execute()
        R.track_progress(progress_bar=False, timeout=600)
        fetched = {name: R.fetch_persisting_op(name) for name in ops}
        seconds = time.perf_counter() - start
        keys = session.keys()
        stored = sum(session.client.hstrlen(FederatedKeys(keys).partials, p)
                     for p in session.client.hkeys(FederatedKeys(keys).partials))
        for hash_key in (public_keys_key(keys), shares_key(keys), reveals_key(keys)):
            stored += sum(len(k) + len(v) for k, v in session.client.hgetall(hash_key).items())
        results[mode] = {"seconds": round(seconds, 3), "bytes_written_by_providers": stored,
                         "mean": fetched.get("mean", fetched.get("median"))}
    R.flush()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    print(json.dumps({"in_process": in_process(args.rows)}, indent=1))
    with tempfile.TemporaryDirectory() as folder:
        print(json.dumps({"end_to_end": end_to_end(args.rows, folder)}, indent=1))


if __name__ == "__main__":
    main()
