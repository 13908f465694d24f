"""A training loop's steps in this process, op by op (the plain runner) against the step compiler's rewrites
(ravop/runtime/step_compiler.py) and against eager PyTorch (autograd + torch.optim.Adam as a CPU runs it by default, the
per-parameter loop, as the engine's Adam() does), and both with Adam(fused=True), on the same shapes: the digits
MLP and CNN (5 epochs, batch 32, as benchmarks/bench_contention.py) and the MNIST-sized MLP of
benchmarks/bench_ravdl.py (1 epoch, batch 128); with `--cases resnet,gpt`, two real-model shapes through
`Pytorch_Model` (benchmarks/real_models.py: a resnet-like CNN on 3x32x32 images in batches of 16 and a small GPT,
8 steps each), the compiled step running the TorchScript forward once per step (issue 46).

    python benchmarks/bench_step.py [--repeats 7] [--cases mlp,cnn,mnist,resnet,gpt] [--threads 1]

Each repeat runs the loop plain, compiled and eager back to back; the best of the repeats is printed (the run
least disturbed by other work on a shared machine), with the ratios to eager. The loop's time here is what a
worker spends executing it, without the store (data upload, checkpoints, loss writes): see bench_ravdl.py and
bench_contention.py for a fit end to end. Also prints the op-by-op profile of one compiled loop (--profile).
"""
import argparse
import contextlib
import io
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ravop as R  # noqa: E402
import bench_contention  # noqa: E402
import bench_ravdl  # noqa: E402
from example_data import digits_data  # noqa: E402
from ravop.record.graph import current_graph  # noqa: E402
from ravop.runtime.evaluate import evaluate  # noqa: E402
from ravop.runtime.loop_run import LoopRun  # noqa: E402


def recorded_loop(record):
    """(spec, input values, seed) of the one loop `record()` records."""
    graph = R.Graph(name="bench step", seed=0)
    with contextlib.redirect_stdout(io.StringIO()):
        record()
    graph = current_graph()
    (loop_id, loop), = graph.loops.items()
    inputs = evaluate(list(graph.nodes[loop_id].inputs))
    return loop.spec, inputs, graph.seed


class Always:
    """Step-compiler decisions fixed in advance: every template compiled (no trial runs)."""

    def load(self, key):
        return {"compiled": 1.0}

    def store(self, key, figures):
        pass


def cases(names):
    X, _, y, _ = digits_data()
    known = {
        "mlp": ("digits MLP", lambda fused=False: bench_contention.record_mlp(5, 32, X, y, fused),
                lambda fused=False: bench_contention.eager_fit(bench_contention.eager_mlp, 5, 32, X, y, fused)),
        "cnn": ("digits CNN", lambda fused=False: bench_contention.record_cnn(5, 32, X, y, fused),
                lambda fused=False: bench_contention.eager_fit(bench_contention.eager_cnn, 5, 32, X, y, fused)),
    }
    if "resnet" in names or "gpt" in names:
        import real_models
        known["resnet"] = ("resnet-like", real_models.record_resnet, real_models.eager_resnet)
        known["gpt"] = ("GPT", real_models.record_gpt, real_models.eager_gpt)
    if "mnist" in names:
        Xm, ym = bench_ravdl.mnist_data()
        weights = bench_ravdl.mnist_weights()
        known["mnist"] = ("MNIST MLP", lambda fused=False: bench_ravdl.record_mnist(1, Xm, ym, weights, fused),
                          lambda fused=False: bench_ravdl.eager_mnist(1, Xm, ym, weights, fused=fused)[0])
    return [known[n] for n in names]


def timed(run):
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def profile(loop_run, label):
    """Seconds per op name over one run of `loop_run`, as its calls run them."""
    spent, count = defaultdict(float), defaultdict(int)
    for step in loop_run.steps:
        runner = step.runner
        runner.calls = list(runner.calls)   # a new list: the compiled step runs it as it is, not its folded plan
        for index, (kernel, args, params, out, frees, varies) in enumerate(runner.calls):
            op = runner.nodes[index].op

            def clocked(*a, _kernel=kernel, _op=op, **p):
                start = time.perf_counter()
                try:
                    return _kernel(*a, **p)
                finally:
                    spent[_op] += time.perf_counter() - start
                    count[_op] += 1
            if varies is None:
                runner.calls[index] = (clocked, args, params, out, frees, None)
            else:
                def clocked_varies(kernel, a, p, at, _varies=varies, _op=op):
                    start = time.perf_counter()
                    try:
                        return _varies(kernel, a, p, at)
                    finally:
                        spent[_op] += time.perf_counter() - start
                        count[_op] += 1
                runner.calls[index] = (kernel, args, params, out, frees, clocked_varies)
    total = timed(loop_run.run)
    print(f"\n{label}: {total:.3f} s, of which in kernels {sum(spent.values()):.3f} s")
    for op in sorted(spent, key=spent.get, reverse=True)[:12]:
        print(f"  {op:<30}{spent[op] * 1e3:8.1f} ms {count[op]:6d} calls {spent[op] / count[op] * 1e6:8.1f} us")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cases", default="mlp,cnn,mnist")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="per-op times of one plain and one compiled loop")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'case':<12}{'eager s':>9}{'plain s':>9}{'compiled s':>12}{'plain/eager':>13}{'compiled/eager':>16}"
          f"{'eager fused s':>15}{'compiled fused s':>18}{'fused/eager fused':>19}  rewrites")
    for label, record, eager in cases(args.cases.split(",")):
        spec, inputs, seed = recorded_loop(record)
        plain = LoopRun(spec, inputs, seed, decisions=None)
        compiled = LoopRun(spec, inputs, seed, decisions=Always())
        compiled_fused = LoopRun(*recorded_loop(lambda: record(fused=True)), decisions=Always())
        with torch.no_grad():
            same = all(torch.equal(a, b) for a, b in zip(plain.run(), compiled.run()))
        times = {"eager": [], "eager_fused": [], "plain": [], "compiled": [], "compiled_fused": []}
        eager()
        for _ in range(args.repeats):
            times["eager"].append(eager())
            times["eager_fused"].append(eager(fused=True))
            with torch.no_grad():
                times["plain"].append(timed(plain.run))
                times["compiled"].append(timed(compiled.run))
                times["compiled_fused"].append(timed(compiled_fused.run))
        best = {k: min(v) for k, v in times.items()}
        rewrites = compiled.steps[0].tuned.compiled.rewrites if compiled.steps[0].tuned else {}
        print(f"{label:<12}{best['eager']:>9.3f}{best['plain']:>9.3f}{best['compiled']:>12.3f}"
              f"{best['plain'] / best['eager']:>13.2f}{best['compiled'] / best['eager']:>16.2f}"
              f"{best['eager_fused']:>15.3f}{best['compiled_fused']:>18.3f}"
              f"{best['compiled_fused'] / best['eager_fused']:>19.2f}  "
              f"{', '.join(f'{k} {v}' for k, v in rewrites.items() if v)}{'' if same else '  BITS DIFFER'}",
              flush=True)
        if spec.n_steps:
            print(f"{'':<12}per step ({spec.n_steps} steps): eager {best['eager'] / spec.n_steps * 1e3:.1f} ms, "
                  f"plain {best['plain'] / spec.n_steps * 1e3:.1f} ms, "
                  f"compiled {best['compiled'] / spec.n_steps * 1e3:.1f} ms", flush=True)
        if args.profile:
            with torch.no_grad():
                profile(plain, f"{label}, plain")
                profile(compiled, f"{label}, compiled")


if __name__ == "__main__":
    main()
