"""What checking a value's seal costs a fetch (ravop.store.seals, issue 44): the same persisted value fetched from
a graph run under R.Graph(verify=2) (sealed: its sealers read, its digest recomputed and compared) and from the
same graph run plainly (verify=1), on the embedded default with 2 workers (on the server's default user each
worker is its own principal; sizes from 256: a smaller product is folded at R.activate(), computed by no worker and
not sealed). Printed per size: the median fetch of each, the ratio and the difference.

    python benchmarks/bench_seal.py [--sizes 256,1024,2048] [--repeats 20]
"""
import argparse
import statistics
import time

import torch

import ravop as R


def run(n: int, verify: int) -> None:
    R.Graph(name=f"seal-{n}-{verify}", verify=verify)
    x = R.t(torch.rand(n, n, generator=torch.Generator().manual_seed(0)))
    (x @ x).persist_op("out")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=600)


def fetch_median(repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        R.fetch_persisting_op("out")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="256,1024,2048")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    R.initialize(workers=2)
    print(f"{'n x n float32':>14} {'MB':>7} {'plain ms':>9} {'sealed ms':>10} {'ratio':>6} {'+ms':>7}")
    for n in (int(s) for s in args.sizes.split(",")):
        run(n, 1)
        plain = fetch_median(args.repeats)
        run(n, 2)
        sealed = fetch_median(args.repeats)
        print(f"{n:>14} {n * n * 4 / 1e6:>7.2f} {plain * 1e3:>9.3f} {sealed * 1e3:>10.3f} {sealed / plain:>6.2f} "
              f"{(sealed - plain) * 1e3:>7.3f}")
    R.flush()


if __name__ == "__main__":
    main()
