"""The requester's memory for one big tensor through the embedded default: R.t(X) of an X of --mb MB, a
worker computes X * 2, the requester fetches it. Prints the requester's peak resident memory (VmHWM) above
what it held once X existed, after each step, and the time of each step; an eager `X * 2` in PyTorch is
the reference (one result as big as X).

    python benchmarks/bench_big_tensor_memory.py --mb 500
"""
import argparse
import time

import numpy as np
import torch


def peak_mb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=500.0, help="size of X in MB (float32)")
    args = parser.parse_args()
    import ravop as R
    session = R.initialize(token="bench-big-tensor", workers=1)
    R.flush()
    X = np.random.default_rng(0).random(int(args.mb * 2**20 / 4), dtype=np.float32)
    base = peak_mb()
    steps = []

    def step(what, started):
        steps.append((what, time.perf_counter() - started, peak_mb() - base))

    started = time.perf_counter()
    R.Graph(name="big tensor")
    x = R.t(X)
    step("R.t(X)", started)
    (x * 2).persist_op("y")
    started = time.perf_counter()
    R.activate()
    step("R.activate() (upload)", started)
    started = time.perf_counter()
    R.execute()
    R.track_progress(progress_bar=False)
    step("R.execute() + track_progress()", started)
    started = time.perf_counter()
    y = R.fetch_persisting_op("y")
    step("R.fetch_persisting_op (download)", started)
    assert torch.equal(y, torch.from_numpy(X) * 2)
    del y
    started = time.perf_counter()
    eager = torch.from_numpy(X) * 2
    eager_seconds = time.perf_counter() - started
    print(f"X: {X.nbytes / 2**20:.0f} MiB; requester peak RSS above the baseline with X (VmHWM), cumulative:")
    for what, seconds, mb in steps:
        print(f"  {what:<36} {seconds:7.2f} s  peak +{mb:7.0f} MiB")
    print(f"  eager torch X * 2 for reference      {eager_seconds:7.2f} s  (one {eager.nbytes / 2**20:.0f} MiB result)")
    R.flush()
    session.close()


if __name__ == "__main__":
    main()
