"""What adaptive spot checks (`R.Graph(verify='spot')`, docs/operators/verification.md) cost honest workers, and how
fast they catch cheaters.

    python benchmarks/bench_verify.py [--branches 16] [--repeats 3] [--trials 400] [--honest 10000]

Part 1, overhead (a private Valkey server and two worker processes, one thread each): a graph of `--branches`
independent branches (each a chain of 8 512x512 matmuls and tanh) run without verification and
under verify=R.Verify(rate=0.1) once both workers are trusted, best of `--repeats`; then a `fit` (one loop of 320
steps of a 64-512-512-8 MLP, checkpoints every 10 steps) both ways. Rows: wall time, and extra compute (re-runs over results, counted from the
store: every checked result costs `copies - 1` re-runs). Eager PyTorch runs the branches in this process for scale.

Part 3, across numerics classes (issue 42): every result checked (rate 1), by a worker of the runner's class
(bitwise digests, as before) or of an emulated older CPU (AVX: values compared within the tolerance), each
against no verification on the same pair; with the largest honest distance measured (`--classes-only`).
Part 4, drift: an eager digits-shaped MLP and CNN with Adam from one state in processes of each class (and a run with
+1e-4 on one layer's output, a subtle cheat): the distance the check's tolerance bounds, after 1 to 1,000 steps.

Part 2, detection: the engine's own SPOT script (ravop/store/spot_scripts.py) on a private server, driven by a
model of workers in Python: each result is a digest handed in as a worker would, checks are answered by honest
workers, and a worker is caught when the script bans it. Nothing of the policy is re-implemented here.
- A cheater that earned trust first (`trust_after` + a random number of honest results) and then corrupts a
  fraction f = 0.1 of its results, at several rates: caught within 500 of its results (how often), and results
  until caught (mean), against the closed form P = 1 - (1 - f * rate)^n (mean 1 / (f * rate)).
- `--honest` results of honest workers (checked and unchecked): workers banned (false accusations).
- A population (50 workers, 10% cheaters, each honest for 0-40 results first): cheaters caught, corrupted results
  accepted unchecked, honest workers banned.
"""
import argparse
import os
import random
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compiler.cost import DEVICES  # noqa: E402
import ravop as R  # noqa: E402
from ravop.client.session import require  # noqa: E402
from ravop.core.spot_policy import Verify, read_trust  # noqa: E402
from ravop.local.embedded import LocalServer, start_worker  # noqa: E402
from ravop.store import GraphKeys, TokenKeys, connect, queue, votes  # noqa: E402
from ravop.store.keys import worker_key  # noqa: E402
from ravop.store.spot_scripts import SpotScript  # noqa: E402

N = 512
CHAIN = 8
RATES = (0.02, 0.05, 0.1, 0.2)
CORRUPT = 0.1
WITHIN = 500


# ------------------------------------------------------------------------------------------ part 1: overhead

def record_branches(branches, verify):
    R.Graph(name="branches", verify=verify)
    generator = torch.Generator().manual_seed(0)
    for b in range(branches):
        x = R.t(torch.rand(N, N, generator=generator) / N)
        for _ in range(CHAIN):
            x = R.tanh(x @ x)
        x.persist_op(f"out_{b}")
    R.activate(devices=DEVICES)


def eager_branches(branches):
    generator = torch.Generator().manual_seed(0)
    began = time.perf_counter()
    for _ in range(branches):
        x = torch.rand(N, N, generator=generator) / N
        for _ in range(CHAIN):
            x = torch.tanh(x @ x)
    return time.perf_counter() - began


def record_fit(verify):
    from ravdl.v2 import NeuralNetwork
    from ravdl.v2.layers import Activation, Dense
    from ravdl.v2.optimizers import Adam
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2048, 64)), np.eye(8)[rng.integers(0, 8, 2048)]
    R.Graph(name="fit", seed=1, verify=verify)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    for layer in (Dense(512, input_shape=(64,)), Activation("relu"), Dense(512), Activation("relu"), Dense(8)):
        model.add(layer)
    model.fit(x, y, n_epochs=10, batch_size=64)   # 320 steps: 32 segments of 10
    R.activate()


def timed_run(client, token):
    """(seconds, results, re-runs) of the current graph, from R.execute() until it is done."""
    began = time.perf_counter()
    R.execute()
    R.track_progress(progress_bar=False, timeout=3600)
    seconds = time.perf_counter() - began
    keys = require().keys()
    results = reruns = 0
    for key in client.scan_iter(keys.prefix + "votes:*"):   # each check, derived from its voters' keys
        sid, _, segment = key.decode()[len(keys.votes("")):].partition(":")
        check = votes.check(client, keys, sid, segment or None)
        results += 1
        reruns += len(check.digests) - 1 if check.state != "unchecked" else 0
    return seconds, results, reruns


def overhead(args):
    server = LocalServer()
    client = connect(server.url)
    logs = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    procs = [start_worker(server.url, f"bench-{k}", "cpu", threads=1, log_path=str(logs / f"{k}.log"),
                          extra_args=["--checkpoint-steps", "10"]) for k in range(2)]
    try:
        while not all(client.exists(worker_key(f"bench-{k}")) for k in range(2)):
            time.sleep(0.1)
        token = f"bench-{uuid.uuid4().hex[:6]}"
        R.initialize(token=token, redis_url=server.url)
        policy = Verify(rate=0.1, trust_after=10)
        while True:   # earn trust: every result is checked until 10 in a row are confirmed
            trust = read_trust(client.hgetall(TokenKeys(token).trust))   # per principal@numerics class
            if all(any(m.startswith(f"bench-{k}@") and t["streak"] >= policy.trust_after for m, t in trust.items())
                   for k in range(2)):
                break
            record_branches(args.branches, policy)
            timed_run(client, token)
        eager = min(eager_branches(args.branches) for _ in range(args.repeats))
        rows = []
        for what, record in (("branches", lambda v: record_branches(args.branches, v)), ("fit", record_fit)):
            plain, spot = [], []
            for _ in range(args.repeats):
                record(1)
                plain.append(timed_run(client, token))
                record(policy)
                spot.append(timed_run(client, token))
            best_plain = min(s for s, _, _ in plain)
            best_spot = min(s for s, _, _ in spot)
            results = sum(r for _, r, _ in spot)
            reruns = sum(x for _, _, x in spot)
            rows.append((what, best_plain, best_spot, 100 * (best_spot / best_plain - 1), results, reruns,
                         100 * reruns / max(results, 1)))
        print(f"\nPart 1: honest trusted workers, verify=R.Verify(rate=0.1) vs none (best of {args.repeats}; "
              f"eager PyTorch, branches: {eager * 1e3:.0f} ms)")
        print(f"{'graph':10} {'none (s)':>9} {'spot (s)':>9} {'wall +%':>8} {'results':>8} {'re-runs':>8} "
              f"{'extra compute %':>16}")
        for row in rows:
            print(f"{row[0]:10} {row[1]:9.2f} {row[2]:9.2f} {row[3]:8.1f} {row[4]:8d} {row[5]:8d} {row[6]:16.1f}")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        server.stop()


# ------------------------------------------------------------------------------ part 3: across numerics classes

AVX = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AVX", "ONEDNN_MAX_CPU_ISA": "AVX"}   # an emulated older CPU
SSE4 = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}
SPREAD = re.compile(r"'s values are (\S+) from this worker's")


def start_pair(server, logs, tag, env):
    """Two workers (one thread each), the second with `env` added to its environment; their names."""
    names = [f"{tag}-0", f"{tag}-1"]
    procs = [start_worker(server.url, names[0], "cpu", threads=1, log_path=str(logs / f"{names[0]}.log"),
                          extra_args=["--checkpoint-steps", "10"])]
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        procs.append(start_worker(server.url, names[1], "cpu", threads=1, log_path=str(logs / f"{names[1]}.log"),
                                  extra_args=["--checkpoint-steps", "10"]))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return names, procs


def across_classes(args):
    """Every result checked (rate 1, never trusted), by a worker of the runner's class (today's bitwise
    comparison) or of another (the comparison by tolerance, reading the runner's values): wall time of the
    branches and the fit, against no verification on the same pair."""
    server = LocalServer()
    client = connect(server.url)
    logs = Path(tempfile.mkdtemp(prefix="bench-verify-classes-"))
    every = Verify(rate=1.0, trust_after=10**6)
    rows = []
    try:
        for what, env in (("same class", {}), ("across classes", AVX)):
            names, procs = start_pair(server, logs, what.split()[0], env)
            try:
                while not all(client.exists(worker_key(n)) for n in names):
                    time.sleep(0.1)
                R.initialize(token=f"bench-{uuid.uuid4().hex[:6]}", redis_url=server.url)
                for graph, record in (("branches", lambda v: record_branches(args.branches, v)), ("fit", record_fit)):
                    plain, spot = [], []
                    for _ in range(args.repeats):
                        record(1)
                        plain.append(timed_run(client, None)[0])
                        record(every)
                        spot.append(timed_run(client, None)[0])
                    rows.append((what, graph, min(plain), min(spot)))
                spreads = [float(v) for n in names for v in SPREAD.findall((logs / f"{n}.log").read_text())]
                rows.append((what, "compared", len(spreads), max(spreads, default=0.0)))
            finally:
                for proc in procs:
                    proc.terminate()
                for proc in procs:
                    proc.wait(timeout=60)
    finally:
        server.stop()
    print(f"\nPart 3: every result checked (rate 1), checker of the runner's class vs of another (best of "
          f"{args.repeats})")
    print(f"{'pair':15} {'graph':9} {'none (s)':>9} {'spot (s)':>9} {'spot/none':>10}")
    for pair, graph, a, b in rows:
        if graph == "compared":
            print(f"{pair:15} {'':9} values compared by tolerance: {a}, largest honest distance {b:.3g}")
        else:
            print(f"{pair:15} {graph:9} {a:9.2f} {b:9.2f} {b / a:10.2f}")


DRIFT_STEPS = (1, 5, 10, 100, 1000)
# One eager digits-shaped model (an MLP 64-32-10, or a CNN on 8x8 images: conv 16, pool, conv 32, linear;
# cross-entropy, Adam) from one seed, in a process of the class under test; with CHEAT set, its first layer's
# output gets +CHEAT at every step (a subtly wrong kernel).
DRIFT = """
import os, sys, torch
torch.set_num_threads(int(sys.argv[2]))
torch.manual_seed(0)
nn = torch.nn
if sys.argv[3] == "mlp":
    x = torch.randn(512, 64)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
else:
    x = torch.randn(512, 1, 8, 8)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.Flatten(), nn.Linear(32 * 16, 10))
y = torch.randint(0, 10, (512,))
cheat = float(os.environ.get("CHEAT", "0"))
if cheat:
    model[0].register_forward_hook(lambda m, i, out: out + cheat)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
kept = {}
for step in range(1, %d + 1):
    batch = slice((step * 64) %% 512, (step * 64) %% 512 + 64)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
    opt.step()
    if step in %r:
        kept[step] = [p.detach().clone() for p in model.parameters()] + \
            [v.clone() for s in opt.state.values() for v in (s["exp_avg"], s["exp_avg_sq"])]
torch.save(kept, sys.argv[1])
"""


def drift():
    """How far honest runs of other classes (and a +1e-4 cheat) are from the machine's own after 1..1000 steps
    from one state: the distance the check's tolerance bounds (spot_policy.scaled_difference) over parameters
    and Adam's moments."""
    import subprocess
    from ravop.core.spot_policy import DEFAULT_TOLERANCE, scaled_difference
    folder = Path(tempfile.mkdtemp(prefix="bench-verify-drift-"))
    script = DRIFT % (max(DRIFT_STEPS), DRIFT_STEPS)
    runs = {"avx2 t1": ({}, 1), "avx t1": (AVX, 1), "sse4 t1": (SSE4, 1), "avx2 t2": ({}, 2),
            "cheat 1e-4": ({"CHEAT": "1e-4"}, 1)}
    print(f"\nPart 4: distance from the machine's own class (avx2 t1) after n steps from one state "
          f"(tolerance {DEFAULT_TOLERANCE:g})")
    print(f"{'model':6}{'run':12} " + " ".join(f"{n:>10}" for n in DRIFT_STEPS))
    for model in ("mlp", "cnn"):
        kept = {}
        for name, (env, threads) in runs.items():
            path = folder / f"{model}-{name.replace(' ', '-')}.pt"
            subprocess.run([sys.executable, "-c", script, str(path), str(threads), model], env={**os.environ, **env},
                           check=True)
            kept[name] = torch.load(path)
        for name in list(runs)[1:]:
            print(f"{model:6}{name:12} " + " ".join(f"{scaled_difference(kept[name][n], kept['avx2 t1'][n]):10.2e}"
                                                  for n in DRIFT_STEPS))


# ------------------------------------------------------------------------------------------ part 2: detection

class Policy:
    """Drives the engine's SPOT script for a token of its own: results handed in as workers hand them in."""

    def __init__(self, client, verify):
        self.client, self.script = client, SpotScript(client)
        self.token = f"sim-{uuid.uuid4().hex[:8]}"
        self.keys = GraphKeys(self.token, "g")
        client.hset(self.keys.meta, mapping={"state": "running", "spot": verify.encode()})
        self.result = 0

    def banned(self, worker):
        return bool(self.client.sismember(TokenKeys(self.token).banned, worker))

    def run(self, runner, lies, checkers):
        """Hand in one result of `runner` (`lies(worker)`: whether that worker's run of it is corrupt), and the
        re-runs the script asks for, from `checkers` in turn. True if the result was checked."""
        self.result += 1
        digest = lambda worker: "bad-" + worker if lies(worker) else "good"   # noqa: E731
        reply = self.script.submit(self.keys, self.result, runner, digest(runner), "cpu")
        checked = reply[0] == "hold"
        for checker in checkers:
            if reply[0] != "hold":
                break
            reply = self.script.submit(self.keys, self.result, checker, digest(checker), "cpu")
        return checked

    def drop(self):
        self.client.delete(*self.client.keys(f"ravop:{self.token}:*"))
        self.client.xtrim(queue("cpu"), maxlen=0)


def time_to_catch(client, rate, trust_after=10, honest_first=(0, 40), limit=WITHIN):
    """Results a cheater hands in after it starts cheating until it is banned (None: not within `limit`)."""
    sim = Policy(client, Verify(rate=rate, trust_after=trust_after))
    honest = trust_after + random.randint(*honest_first)
    checkers = ["h1", "h2", "h3"]
    try:
        for _ in range(honest):
            sim.run("cheater", lambda w: False, checkers)
        for n in range(1, limit + 1):
            corrupt = random.random() < CORRUPT
            sim.run("cheater", lambda w: w == "cheater" and corrupt, checkers)
            if sim.banned("cheater"):
                return n
        return None
    finally:
        sim.drop()


def detection(client, args):
    print(f"\nPart 2a: a trusted cheater corrupting {CORRUPT:.0%} of its results ({args.trials} cheaters "
          "at each rate); the formula P = 1 - (1 - f*rate)^n")
    print(f"{'rate':>5} {'trials':>7} {f'caught <= {WITHIN}':>13} {'formula':>8} {'mean results':>13} "
          f"{'formula':>8}")
    for rate in RATES:
        trials = args.trials
        times = [time_to_catch(client, rate) for _ in range(trials)]
        caught = [t for t in times if t is not None]
        formula = 1 - (1 - CORRUPT * rate) ** WITHIN
        # the mean of a geometric law truncated at WITHIN, to compare with the caught ones' mean
        p = CORRUPT * rate
        truncated = (1 / p - (WITHIN + 1 / p) * (1 - p) ** WITHIN) / formula
        print(f"{rate:5.2f} {trials:7d} {len(caught) / trials:13.3f} {formula:8.3f} "
              f"{(sum(caught) / len(caught)) if caught else float('nan'):13.1f} {truncated:8.1f}")


def false_accusations(client, args):
    sim = Policy(client, Verify(rate=0.1, trust_after=10))
    workers = [f"honest-{k}" for k in range(10)]
    checked = 0
    try:
        for _ in range(args.honest):
            runner, *checkers = random.sample(workers, 4)
            checked += sim.run(runner, lambda w: False, checkers)
        banned = client.scard(TokenKeys(sim.token).banned)
    finally:
        sim.drop()
    print(f"\nPart 2b: {args.honest:,} honest results (10 workers, rate 0.1, trust after 10): {checked:,} checked, "
          f"{banned} workers banned")


def population(client, n_workers=50, cheaters=5, results=20_000, rate=0.1):
    sim = Policy(client, Verify(rate=rate, trust_after=10))
    workers = [f"w{k}" for k in range(n_workers)]
    cheating = {w: random.randint(0, 40) for w in random.sample(workers, cheaters)}   # honest results first
    done = dict.fromkeys(workers, 0)
    caught_at, accepted_bad = {}, 0
    live = workers
    try:
        for n in range(results):
            if n % 100 == 0:   # banned workers get no more work (the engine passes their messages on)
                live = [w for w in workers if not sim.banned(w)]
            runner, *checkers = random.sample(live, 4)
            draws = {w: w in cheating and done[w] >= cheating[w] and random.random() < CORRUPT for w in
                     (runner, *checkers)}
            done[runner] += 1
            checked = sim.run(runner, draws.__getitem__, checkers)
            if draws[runner] and not checked:
                accepted_bad += 1
            for w in cheating:
                if w not in caught_at and sim.banned(w):
                    caught_at[w] = done[w] - cheating[w]
        honest_banned = sum(sim.banned(w) for w in workers if w not in cheating)
    finally:
        sim.drop()
    print(f"\nPart 2c: population of {n_workers} workers, {cheaters} cheaters (honest for 0-40 results, then "
          f"corrupting {CORRUPT:.0%}), {results:,} results at rate {rate}: {len(caught_at)}/{cheaters} cheaters "
          f"banned (after {sorted(caught_at.values())} of their results since cheating), {accepted_bad} corrupt "
          f"results accepted unchecked, {honest_banned} honest workers banned")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--branches", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--honest", type=int, default=10_000)
    parser.add_argument("--skip-overhead", action="store_true", help="only the detection part")
    parser.add_argument("--classes-only", action="store_true",
                        help="only parts 3 and 4: checks across numerics classes, and the drift they judge")
    args = parser.parse_args(argv)
    random.seed(0)
    if args.classes_only:
        across_classes(args)
        drift()
        return
    if not args.skip_overhead:
        overhead(args)
        across_classes(args)
        drift()
    server = LocalServer()
    try:
        client = connect(server.url)
        detection(client, args)
        false_accusations(client, args)
        population(client)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
