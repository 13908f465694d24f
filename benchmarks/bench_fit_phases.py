"""Where a digits fit's time goes end to end, beside the loop alone: the README's embedded default
(`R.initialize()`: a private server and 2 local workers), each fit split into its phases, against the same
loop run in this process (compiled, as benchmarks/bench_step.py runs it) and eager PyTorch, interleaved.

    python benchmarks/bench_fit_phases.py [--cases cnn,mlp] [--repeats 5] [--epochs 5] [--rows N]

`--epochs 1 --rows 32` (one step) leaves almost nothing but the fixed costs. `--hop` also runs each fit, interleaved,
compiled as before the loop's fills (compiler/partition.py): its zero-initialised state in a subgraph of its own,
a hop before the loop (the row "<case>, hop").

Phases of one fit, as a user waits for them: recording (`model.fit` on the lazy graph), R.activate (compile
and upload), R.execute, R.track_progress (the workers: the hop to the first subgraph, the loop's subgraph
picked up, its steps, the loss writes, the last write and the graph's end), then every batch loss fetched by
name. "beyond the loop" is the fit less the in-process loop of the same run: what the engine adds around the
steps. Best of the repeats (the run least disturbed on a shared machine); the load average is printed.
"""
import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import compiler.partition as partition  # noqa: E402
import ravop as R  # noqa: E402
from ravop.client import session as sessions  # noqa: E402
import bench_contention  # noqa: E402
from bench_step import recorded_loop, timed  # noqa: E402
from busy import load  # noqa: E402
from example_data import digits_data  # noqa: E402
from ravop.core.loss_names import training_loss_name  # noqa: E402
from ravop.runtime import step_compiler  # noqa: E402
from ravop.runtime.loop_run import LoopRun  # noqa: E402

EPOCHS, BATCH = 5, 32
PHASES = ("record", "activate", "execute", "track", "fetch")


def phased_fit(record, n_rows, epochs=EPOCHS):
    """{phase: seconds} of one fit on the engine, every loss fetched by name."""
    marks = [time.perf_counter()]
    R.flush()
    R.Graph(name="fit phases", seed=0)
    with contextlib.redirect_stdout(io.StringIO()):
        record()
    marks.append(time.perf_counter())
    R.activate()
    marks.append(time.perf_counter())
    R.execute()
    marks.append(time.perf_counter())
    R.track_progress(progress_bar=False)
    marks.append(time.perf_counter())
    for epoch in range(1, epochs + 1):
        for step in range(1, -(-n_rows // BATCH) + 1):
            R.fetch_persisting_op(training_loss_name(epoch, step))
    marks.append(time.perf_counter())
    return dict(zip(PHASES, (b - a for a, b in zip(marks, marks[1:]))))


@contextlib.contextmanager
def no_fills():
    """Compile as before a loop's fills: its zero-initialised state a subgraph of its own, a hop before it."""
    rule = partition.loop_fills
    partition.loop_fills = lambda ir: {}
    try:
        yield
    finally:
        partition.loop_fills = rule


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="cnn,mlp")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--rows", type=int, default=None, help="the first N training rows (default: all)")
    parser.add_argument("--hop", action="store_true", help="also the fits compiled with no fills in their loops")
    args = parser.parse_args()
    torch.set_num_threads(1)
    X, _, y, _ = digits_data()
    X, y = X[:args.rows], y[:args.rows]
    known = {"cnn": ("digits CNN", bench_contention.record_cnn, bench_contention.eager_cnn),
             "mlp": ("digits MLP", bench_contention.record_mlp, bench_contention.eager_mlp)}
    R.initialize()
    session = sessions.require()
    session.embedded.wait_ready(session.client)
    print(f"embedded default up; {load()}; best of {args.repeats}, ms", flush=True)
    print(f"{'case':<16}" + "".join(f"{p:>9}" for p in PHASES) + f"{'fit':>8}{'loop':>8}{'beyond':>8}"
          f"{'eager':>8}{'fit/eager':>11}{'loop/eager':>11}")
    for name in args.cases.split(","):
        label, record, eager_model = known[name]
        fit_record = (lambda r=record: r(args.epochs, BATCH, X, y))
        spec, inputs, seed = recorded_loop(fit_record)
        loop = LoopRun(spec, inputs, seed, decisions=step_compiler.MemoryDecisions())
        phased_fit(fit_record, len(X), args.epochs)   # warm: the workers' step decisions, the first graph's costs
        with torch.no_grad():
            loop.run()
        fits, hops, loops, eagers = [], [], [], []
        for _ in range(args.repeats):
            fits.append(phased_fit(fit_record, len(X), args.epochs))
            if args.hop:
                with no_fills():
                    hops.append(phased_fit(fit_record, len(X), args.epochs))
            with torch.no_grad():
                loops.append(timed(loop.run))
            eagers.append(bench_contention.eager_fit(eager_model, args.epochs, BATCH, X, y))
        loop_s, eager = min(loops), min(eagers)
        for row, runs in ((label, fits), (f"{label}, hop", hops)):
            if runs:
                best = min(runs, key=lambda f: sum(f.values()))
                fit = sum(best.values())
                print(f"{row:<16}" + "".join(f"{best[p] * 1e3:9.1f}" for p in PHASES) +
                      f"{fit * 1e3:8.1f}{loop_s * 1e3:8.1f}{(fit - loop_s) * 1e3:8.1f}{eager * 1e3:8.1f}"
                      f"{fit / eager:11.2f}{loop_s / eager:11.2f}", flush=True)
    print(load())


if __name__ == "__main__":
    main()
