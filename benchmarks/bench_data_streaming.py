"""Where a big training array lives during a fit, and what streaming it costs: an MLP fitted on an X of --mb MiB
(float32, 256 features) through the embedded default (a private server and one worker), unshuffled, for
--epochs epochs. Each configuration runs in a fresh process (its own server, worker and data dir):

- same host: the worker maps the requester's sealed memory file (ravop.store.same_host), the default on Linux;
- store: RAVOP_SAME_HOST=off, so the worker reads the store as a worker of another host does (streamed on this
  branch: ravop.store.row_stream; read whole before).

`--before DIR` runs the same configurations on another checkout's code too (main's, e.g. /work/main): the
figures before this change, in the same run; `--repeats N` runs each configuration N times, interleaved, and
keeps the fastest. For every process (requester, server, worker, the workers' fork
server) it samples the proportional set size (Pss, /proc/<pid>/smaps_rollup: a page shared by two processes
counts half in each, so the sum is the host's memory) and keeps each one's peak resident size (VmHWM); the sum of
Pss at its peak, less what the processes held before X existed, is printed as a multiple of X's size. Time per
epoch is the fit's loop time (R.execute to its end) over the epochs, against eager PyTorch training the same model
on the same batches of the same array in this process, one torch thread (as the worker has).

    python benchmarks/bench_data_streaming.py --mb 512 --epochs 2 [--repeats 2] [--before /work/main]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

FEATURES, BATCH = 256, 512
ROOT = Path(__file__).resolve().parents[1]


def kib(pid, path, field):
    try:
        with open(f"/proc/{pid}/{path}") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def descendants(root):
    """{pid: role} of `root` and the processes under it, by their command lines."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    found, stack = {}, [(root, None)]
    while stack:
        pid, parent = stack.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # the workers are forked by the fork server (the same command line); the server is its launcher's child
        role = "requester" if pid == root else "worker" if parent == "fork server" else \
            "fork server" if "forkserver" in command else "worker" if "worker" in command else "server"
        found[pid] = role
        stack.extend((child, role) for child in children.get(pid, []))
    return found


class Sampler(threading.Thread):
    """Samples every process's Pss; keeps the peak of their sum, each role's Pss at that peak, and each VmHWM."""

    def __init__(self, root):
        super().__init__(daemon=True)
        self.root, self.stopped = root, threading.Event()
        self.peak_sum, self.at_peak, self.hwm = 0, {}, {}

    def sample(self):
        by_role, total = {}, 0
        for pid, role in descendants(self.root).items():
            pss = kib(pid, "smaps_rollup", "Pss") or 0
            by_role[role] = by_role.get(role, 0) + pss
            total += pss
            hwm = kib(pid, "status", "VmHWM") or 0
            self.hwm[(role, pid)] = max(self.hwm.get((role, pid), 0), hwm)
        if total > self.peak_sum:
            self.peak_sum, self.at_peak = total, by_role
        return total, by_role

    def run(self):
        while not self.stopped.wait(0.2):
            self.sample()


def model_and_data(mb):
    rows = int(mb * 2**20) // (FEATURES * 4)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((rows, FEATURES), dtype=np.float32)
    Y = (X[:, :1] - 0.5 * X[:, 1:2]).astype(np.float32)
    return X, Y


def child(args):
    import ravop as R
    from ravdl.v2 import NeuralNetwork
    from ravdl.v2.layers import Activation, Dense
    from ravdl.v2.optimizers import Adam
    session = R.initialize(token="bench-data-streaming", workers=1)
    R.flush()
    sampler = Sampler(os.getpid())
    time.sleep(1.0)
    before, _ = sampler.sample()   # the processes with torch imported and nothing of X
    sampler.peak_sum = 0
    sampler.start()
    X, Y = model_and_data(args.mb)
    R.Graph(name="data streaming", seed=0)
    model = NeuralNetwork(Adam(lr=0.001), loss="SquareLoss")
    model.add(Dense(64, input_shape=(FEATURES,)))
    model.add(Activation("relu"))
    model.add(Dense(1))
    model.fit(X, Y, n_epochs=args.epochs, batch_size=BATCH, shuffle=False, seed=0)
    started = time.perf_counter()
    R.activate()
    activated = time.perf_counter()
    R.execute()
    R.track_progress(progress_bar=False, timeout=3600)
    done = time.perf_counter()
    sampler.stopped.set()
    sampler.join()
    sampler.sample()
    R.flush()
    reads = read_times(session.client, X)
    session.close()
    hwm = {}
    for (role, _), value in sampler.hwm.items():
        hwm[role] = hwm.get(role, 0) + value
    print(json.dumps({"data": X.nbytes, "before_kib": before, "peak_kib": sampler.peak_sum,
                      "at_peak": sampler.at_peak, "hwm": hwm, "activate_s": activated - started,
                      "epoch_s": (done - activated) / args.epochs, **reads}))


def read_times(client, X):
    """X written to the server again and read back by this process: {"whole_s": read whole, "server_whole_kib": the
    server's peak above its resident size while it sent it, "stream_s": its batches streamed (one epoch), where
    this code streams}."""
    from ravop.store import tensors
    key = "bench-data-streaming-x"
    pipe = client.pipeline(transaction=False)
    tensors.write(pipe, key, torch.from_numpy(X))
    pipe.execute()
    servers = [pid for pid, role in descendants(os.getpid()).items() if role == "server"]
    for pid in servers:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")   # resets its VmHWM to its VmRSS
    resident = sum(kib(pid, "status", "VmRSS") or 0 for pid in servers)
    try:
        started = time.perf_counter()
        whole = tensors.decode(client, key, client.get(key))
        times = {"whole_s": time.perf_counter() - started,
                 "server_whole_kib": sum(kib(pid, "status", "VmHWM") or 0 for pid in servers) - resident}
        del whole
        try:
            from ravop.store import row_stream  # noqa: F401 - on main's code there is none
        except ImportError:
            return times
        started = time.perf_counter()
        rows = tensors.decode(client, key, client.get(key), stream_to="cpu")
        for first in range(0, len(X), BATCH):
            rows.read_rows(slice(first, first + BATCH))
        return {**times, "stream_s": time.perf_counter() - started}
    finally:
        client.delete(*tensors.keys_of(key))


def eager_epoch(mb, epochs):
    torch.set_num_threads(1)
    X, Y = model_and_data(mb)
    X, Y = torch.from_numpy(X), torch.from_numpy(Y)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    started = time.perf_counter()
    for _ in range(epochs):
        for first in range(0, len(X), BATCH):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(X[first:first + BATCH]), Y[first:first + BATCH])
            loss.backward()
            optimizer.step()
    return (time.perf_counter() - started) / epochs


def run(tree, same_host, args):
    env = dict(os.environ, PYTHONPATH=str(tree), RAVOP_SAME_HOST="on" if same_host else "off",
               RAVOP_DATA_DIR=tempfile.mkdtemp(prefix="bench-data-streaming-"))
    done = subprocess.run([sys.executable, __file__, "--child", "--mb", str(args.mb), "--epochs", str(args.epochs)],
                          env=env, cwd=str(tree), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the fit on {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=512.0, help="size of X in MiB (float32)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--before", help="another checkout whose code runs the same configurations (main's)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each configuration, interleaved; the best")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    eager = eager_epoch(args.mb, args.epochs)
    trees = [("this", ROOT)] + ([("before", Path(args.before).resolve())] if args.before else [])
    print(f"X: {args.mb:.0f} MiB float32 ({FEATURES} features), batch {BATCH}, {args.epochs} epochs, unshuffled; "
          f"eager PyTorch {eager:.2f} s/epoch; load {os.getloadavg()[0]:.1f}")
    print(f"{'code':<7} {'worker reads':<13} {'s/epoch':>8} {'x eager':>8} {'activate s':>10} "
          f"{'peak sum of Pss':>16} {'x data':>7}   Pss at that peak, by process (MiB); VmHWM by process (MiB)")
    configurations = [(name, tree, same_host) for name, tree in trees for same_host in (True, False)]
    best = {}
    for _ in range(args.repeats):
        for name, tree, same_host in configurations:
            r = run(tree, same_host, args)
            if (name, same_host) not in best or r["epoch_s"] < best[name, same_host]["epoch_s"]:
                best[name, same_host] = r
    for name, _, same_host in configurations:
        r = best[name, same_host]
        above = (r["peak_kib"] - r["before_kib"]) * 1024
        roles = ", ".join(f"{k} {v / 1024:.0f}" for k, v in sorted(r["at_peak"].items()))
        hwm = ", ".join(f"{k} {v / 1024:.0f}" for k, v in sorted(r["hwm"].items()))
        print(f"{name:<7} {'same host' if same_host else 'store':<13} {r['epoch_s']:8.2f} "
              f"{r['epoch_s'] / eager:7.2f}x {r['activate_s']:10.2f} {above / 2**20:12.0f} MiB "
              f"{above / r['data']:6.2f}x   {roles}; {hwm}", flush=True)
    for name, same_host in best:
        r = best[name, same_host]
        if not same_host and "whole_s" in r:
            streamed = f", streamed in batches of {BATCH} rows {r['stream_s']:.2f} s " \
                f"({r['data'] / 2**20 / r['stream_s']:.0f} MiB/s)" if "stream_s" in r else ""
            print(f"{name}: X alone, from the server after the fit: read whole {r['whole_s']:.2f} s, the server's "
                  f"peak meanwhile +{r['server_whole_kib'] / 1024:.0f} MiB{streamed}")


if __name__ == "__main__":
    main()
