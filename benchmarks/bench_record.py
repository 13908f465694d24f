"""Recording cost: microseconds per op for 100k recorded small elementwise ops (goal: <= 2 us/op, issue 29), and
the time and peak memory (tracemalloc) of recording `fit` and a hand-written loop against their length (goal: the
same at 10 epochs and 10**6, issue 44: persist names by rule, a loop's runs counted, not listed).

Recording is the requester's hot path: it appends a node, runs the op's shape/dtype rule and notes the
user's source line, with no network call. Each case is measured twice: alone, then with the embedded default
up (R.initialize(): its server and idle workers share the machine, as in a user's session); the goal holds for
both. Beside wall-clock time the table shows the requester's own CPU time per op, the figure that stays
meaningful on a machine shared with other jobs.

    python benchmarks/bench_record.py                  # 100k ops per row, best of 3, alone and embedded
    python benchmarks/bench_record.py --quick          # 20k ops per row, best of 1
    python benchmarks/bench_record.py --no-embedded    # alone only (no server or workers started)
    python benchmarks/bench_record.py --loops-only     # only the fit / loop table
    python benchmarks/bench_record.py --activation     # only fit(n_epochs=n) recorded, activated, run and read

`--activation` (issue 44): a fit of 1 step an epoch with EarlyStopping (it stops after 2 epochs), n = 10 to 10**6
epochs, on the embedded default: the seconds of recording, R.activate(), the run (R.execute() to the end of
R.track_progress()) and History's read, the requester's peak traced memory over recording and activation, its
RSS growth, and the store's persist entries; each with its ratio to n = 10's. `--lengths` picks the n's,
`--repeats` the runs of each.
"""
import argparse
import gc
import os
import time
import tracemalloc

import numpy as np
import torch

import ravop as R
from ravop.client import requester  # noqa: F401  (R's names load on first use: now, before the freeze below)

gc.freeze()  # as R.initialize() does (this benchmark records without a session): recording's GC skips torch's objects

GOAL_US = 2.0



def _steps(step):
    """A case running `step` (one call recording exactly 4 ops from x and y, returning the new x) `steps` times."""
    def run(x, y, steps):
        for _ in range(steps):
            x = step(x, y)
        return x
    return run


# A script's top level: one code object for the whole file, whose line Python works out from the start of its
# line table (f_lineno). The same ops as the first case, recorded by a loop after 3,000 lines of the script.
_LONG_SCRIPT = compile("\n".join(f"setting_{i} = {i}" for i in range(1, 3000)) +
                       "\nfor _ in range(steps):\n    x = x + y + y + y + y\n", "long_script.py", "exec")


def _long_script(x, y, steps):
    names = {"x": x, "y": y, "steps": steps}
    exec(_LONG_SCRIPT, names)   # this benchmark's own code, nothing from outside
    return names["x"]


# (row label, run(x, y, steps) recording 4 ops per step)
CASES = [
    ("x + y (dunder, two ops)", _steps(lambda x, y: x + y + y + y + y)),
    ("x * 0.5 (python scalar)", _steps(lambda x, y: x * 0.5 - 0.25 + 1.0 / 3.0 + 2.0)),
    ("R.exp(x) (function)", _steps(lambda x, y: R.neg(R.exp(R.abs(R.square(x)))))),
    ("x.abs() (method)", _steps(lambda x, y: x.abs().neg().square().abs())),
    ("mixed", _steps(lambda x, y: R.exp(x * y + 0.5).abs())),
    ("x + y, line 3,000 of a script", _long_script),
]
OPS_PER_STEP = 4


def record(run, n_ops):
    gc.collect()  # free earlier runs' graphs (Op <-> Graph cycles) so their cleanup is not timed here
    graph = R.Graph(name="bench_record")
    x = R.t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    y = R.t([[0.5, 0.25, 0.125], [1.0, 2.0, 4.0]])
    start_ops = len(graph.nodes)
    start, start_cpu = time.perf_counter(), time.thread_time()
    run(x, y, n_ops // OPS_PER_STEP)
    seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - start_cpu
    recorded = len(graph.nodes) - start_ops
    return seconds / recorded, cpu_seconds / recorded, recorded


def table(title, n_ops, repeats):
    """Print one row per case; return the slowest case's wall-clock seconds per op."""
    print(f"{title}\n{'case':<30} {'ops':>8} {'us/op':>7} {'cpu us/op':>10}")
    worst = 0.0
    for label, run in CASES:
        per_op, cpu_per_op, recorded = min(record(run, n_ops) for _ in range(repeats))
        worst = max(worst, per_op)
        print(f"{label:<30} {recorded:>8} {per_op * 1e6:>7.2f} {cpu_per_op * 1e6:>10.2f}")
    return worst


def _fit(n_epochs):
    from ravdl.v2 import NeuralNetwork
    from ravdl.v2.layers import Activation, Dense
    from ravdl.v2.optimizers import Adam
    rng = np.random.default_rng(0)
    X = rng.normal(size=(70, 6)).astype(np.float32)
    net = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss", validation_data=(X[:10], X[:10, :1]))
    net.add(Dense(12, input_shape=(6,)))
    net.add(Activation("tanh"))
    net.add(Dense(1))
    net.fit(X, X[:, :1], n_epochs=n_epochs, batch_size=16, shuffle=True)   # 5 steps an epoch, the last short


def _loop(n_steps):
    from ravop.record.loop import Loop
    loop = Loop([R.t(torch.zeros(3))])
    with loop.step() as step:
        (w,) = step.carried
        step.carry([w + 1])
    loop.run([(0, n_steps)])


def loops_table():
    """Time and peak traced memory of recording a fit of n epochs (5 steps an epoch, a validation step) and a
    hand-written loop of n steps, each with its ratio to n = 10's."""
    print(f"\nrecording a loop against its length (time: best of 3, peak: worst of 3)\n{'case':<24} {'n':>14} {'ms':>8} {'peak KiB':>9} "
          f"{'x n=10 time':>12} {'x n=10 peak':>12}")
    for label, record_one, lengths in (("fit(n_epochs=n)", _fit, (10, 10**3, 10**6)),
                                       ("R loop of n steps", _loop, (10, 10**3, 10**6, 10**9))):
        base = None
        for n in lengths:
            runs = []
            for _ in range(3):
                gc.collect()
                R.Graph(name="bench_record_loop")
                tracemalloc.start()
                start = time.perf_counter()
                record_one(n)
                runs.append((time.perf_counter() - start, tracemalloc.get_traced_memory()[1]))
                tracemalloc.stop()
            seconds, peak = min(r[0] for r in runs), max(r[1] for r in runs)
            base = base or (seconds, peak)
            print(f"{label:<24} {n:>14,} {seconds * 1e3:>8.2f} {peak / 1024:>9.1f} {seconds / base[0]:>12.2f} "
                  f"{peak / base[1]:>12.2f}")


def _early_stopped_fit(n_epochs):
    """A 1-step-an-epoch shuffled fit that EarlyStopping ends after its second epoch; returns its History."""
    from ravdl.v2 import NeuralNetwork
    from ravdl.v2.callbacks import EarlyStopping
    from ravdl.v2.layers import Activation, Dense
    from ravdl.v2.optimizers import Adam
    rng = np.random.default_rng(5)
    X = rng.normal(size=(16, 6)).astype(np.float32)
    net = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    net.add(Dense(12, input_shape=(6,)))
    net.add(Activation("tanh"))
    net.add(Dense(1))
    return net.fit(X, X[:, :1] * 0.5 - X[:, 1:2] ** 2, n_epochs=n_epochs, batch_size=16, shuffle=True,
                   callbacks=[EarlyStopping(monitor="loss", patience=0, min_delta=1e9)])


def _activation_run(session, process, n):
    """(record, activate, run, History read seconds, peak traced bytes, RSS growth, persist entries) of one fit."""
    gc.collect()
    R.Graph(name=f"bench_activation_{n}", seed=7)
    rss = process.memory_info().rss
    tracemalloc.start()
    start = time.perf_counter()
    history = _early_stopped_fit(n)
    recorded = time.perf_counter()
    R.activate()
    activated = time.perf_counter()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    grown = process.memory_info().rss - rss
    keys = session.keys()
    pipe = session.client.pipeline(transaction=False)
    pipe.hlen(keys.persist)
    pipe.exists(keys.prefix + "persist_rules")   # a list of a few rules where there is one (issue 44)
    entries = sum(pipe.execute())
    R.execute()
    R.track_progress(progress_bar=False, timeout=3600)
    ran = time.perf_counter()
    losses = history.batch_losses
    read = time.perf_counter()
    assert len(losses) == 2 and history.stopped_after == 2, (len(losses), history.stopped_after)
    R.flush()
    return recorded - start, activated - recorded, ran - activated, read - ran, peak, grown, entries


def activation_table(lengths, repeats):
    """Record, activate, run and read a fit of n epochs that stops after 2, per n: each time best of `repeats`,
    memory worst of them, after a warm-up fit (imports, the workers' first step)."""
    import psutil
    session = R.initialize(token="bench-record-activation")
    session.embedded.wait_ready(session.client)   # the workers' start-up (torch import) is not timed
    process = psutil.Process()
    print(f"\nfit(n_epochs=n) with EarlyStopping (2 epochs run), embedded default; load {os.getloadavg()[0]:.2f}\n"
          f"{'n':>10} {'record s':>9} {'activate s':>11} {'run s':>8} {'history s':>10} {'peak MiB':>9} "
          f"{'RSS +MiB':>9} {'entries':>9} {'x n=10 (record+activate+run+history)':>37}")
    _activation_run(session, process, 10)
    base = None
    for n in lengths:
        runs = [_activation_run(session, process, n) for _ in range(repeats)]
        record, activate, run, read = (min(r[i] for r in runs) for i in range(4))
        peak, grown, entries = (max(r[i] for r in runs) for i in range(4, 7))
        total = record + activate + run + read
        base = base or total
        print(f"{n:>10,} {record:>9.3f} {activate:>11.3f} {run:>8.3f} {read:>10.4f} {peak / 2**20:>9.2f} "
              f"{grown / 2**20:>9.1f} {entries:>9,} {total / base:>37.2f}", flush=True)
    session.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20k ops per row, one repeat")
    parser.add_argument("--no-embedded", action="store_true",
                        help="skip the second table (recording with the embedded default's server and workers up)")
    parser.add_argument("--loops-only", action="store_true", help="only the table of fits and loops by length")
    parser.add_argument("--activation", action="store_true",
                        help="only the table of fits recorded, activated, run and read, by length")
    parser.add_argument("--lengths", default="10,1000,100000,1000000", help="--activation's epochs, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="--activation's runs per length (best time of them)")
    args = parser.parse_args()
    if args.activation:
        activation_table([int(n) for n in args.lengths.split(",")], args.repeats)
        return
    if args.loops_only:
        loops_table()
        return
    n_ops, repeats = (20_000, 1) if args.quick else (100_000, 3)
    print(f"load average {os.getloadavg()[0]:.2f}")
    worst = {"alone": table("alone", n_ops, repeats)}
    if not args.no_embedded:
        session = R.initialize(token="bench-record")
        session.embedded.wait_ready(session.client)   # the workers' start-up (torch import) is not timed
        worst["embedded default up"] = table("\nwith the embedded default up (R.initialize(), workers idle)", n_ops,
                                             repeats)
        session.close()
    loops_table()
    print()
    for title, seconds in worst.items():
        print(f"{title}: slowest case {seconds * 1e6:.2f} us/op; goal <= {GOAL_US} us/op: "
              f"{'met' if seconds <= GOAL_US * 1e-6 else 'missed'}")


if __name__ == "__main__":
    main()
