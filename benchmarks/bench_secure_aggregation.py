"""Secure aggregation with dropout recovery (SecAgg+, issue 44): time and bytes of a query, plain against secure,
and secure with one provider dropped after the masks were set up, in one run (a local server, three
`ravop-worker --data` providers).

    python benchmarks/bench_secure_aggregation.py [--rows 100000] [--repeat 5]

Three providers hold --rows values of one column between them; each query asks count, mean, variance
and a 20-bin histogram. "secure, 1 of 4 dropped": a fourth provider (in this process) publishes its keys and
sends its shares, then never its sums: the three close the inputs without it (it has no heartbeat), reveal, and
the requester removes its masks. Time: R.Graph to the fetched values (median of --repeat); bytes: what the
providers wrote to the graph's hashes (partials, public keys, shares, reveals), with the ratio to plain.
"""
import argparse
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import ravop as R
from ravop.federated import recovery
from ravop.local.embedded import LocalServer, start_worker
from ravop.store.federated_schema import FederatedScripts, public_keys, public_keys_key, reveals_key, shares_key
from ravop.store.keys import FederatedKeys, graph_ref, worker_key

HASHES = {"partials": lambda keys: FederatedKeys(keys).partials, "public keys": public_keys_key,
          "shares": shares_key, "reveals": reveals_key}


def share_then_stop(session, name, providers):
    """A provider that joins, publishes its keys and sends its shares, and never its masked sums."""
    keys, scripts, secrets = session.keys(), FederatedScripts(session.client), recovery.ProviderSecrets()
    assert scripts.join(keys, name) == "joined"
    scripts.publish_key(keys, name, secrets.public())
    deadline = time.monotonic() + 60
    while len(publics := public_keys(session.client, keys)) < providers:
        assert time.monotonic() < deadline, "the providers did not publish their keys"
        time.sleep(0.01)
    scripts.share(keys, name, secrets.shares(name, publics, graph_ref(keys)))


def query(session, rules, dropout):
    start = time.perf_counter()
    R.Graph(name="secure-bench", approach="federated", rules=json.dumps(rules))
    ops = {"count": R.federated_count(), "mean": R.federated_mean(), "variance": R.federated_variance(),
           "hist": R.federated_histogram(bins=20)}
    for name, op in ops.items():
        op.persist_op(name)
    R.activate()
    R.execute()
    if dropout:
        share_then_stop(session, "dropout", rules["max_clients"])
    R.track_progress(progress_bar=False, timeout=600)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the dropout's release names it
        fetched = {name: R.fetch_persisting_op(name) for name in ops}
    seconds = time.perf_counter() - start
    keys = session.keys()
    written = {what: sum(len(k) + len(v) for k, v in session.client.hgetall(key(keys)).items())
               for what, key in HASHES.items()}
    return seconds, written, fetched["mean"]["x"]


def run_modes(session, repeat):
    base = {"rules": {"x": {"min": 0, "max": 100}}, "max_clients": 3}
    modes = {"plain": (base, False), "secure": ({**base, "secure": True}, False),
             "secure, 1 of 4 dropped": ({**base, "secure": True, "max_clients": 4}, True)}
    query(session, base, False)   # the providers load their files
    results = {}
    for mode, (rules, dropout) in modes.items():
        runs = [query(session, rules, dropout) for _ in range(repeat)]
        results[mode] = {"median_seconds": round(statistics.median(seconds for seconds, _, _ in runs), 3),
                         "seconds": [round(seconds, 3) for seconds, _, _ in runs],
                         "bytes": runs[-1][1], "total_bytes": sum(runs[-1][1].values()), "mean": runs[-1][2]}
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    server = LocalServer()
    procs = []
    with tempfile.TemporaryDirectory() as folder:
        try:
            for i, share in enumerate((0.5, 0.3, 0.2)):
                path = str(Path(folder) / f"p{i}.parquet")
                pq.write_table(pa.table({"x": rng.uniform(0, 100, int(args.rows * share))}), path)
                procs.append(start_worker(server.url, f"provider-{i}", "cpu", threads=1,
                                          log_path=os.path.join(folder, f"p{i}.log"), extra_args=["--data", path]))
            session = R.initialize(token="bench-secure", redis_url=server.url)
            while not all(session.client.exists(worker_key(f"provider-{i}")) for i in range(3)):
                time.sleep(0.05)
            results = run_modes(session, args.repeat)
            R.flush()
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait()
            server.stop()
    plain = results["plain"]
    for mode, result in results.items():
        result["time_vs_plain"] = round(result["median_seconds"] / plain["median_seconds"], 2)
        result["bytes_vs_plain"] = round(result["total_bytes"] / plain["total_bytes"], 2)
    print(json.dumps({"rows": args.rows, "repeat": args.repeat, "results": results}, indent=1))


if __name__ == "__main__":
    main()
