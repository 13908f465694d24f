"""Real models through the engine against eager PyTorch and torch.compile'd eager, time and memory, in one run
(issue 46): torchvision's resnet18 (3x32x32 images, batch 16, 10 classes: 11.2M parameters), a GPT decoder (6
layers, d_model 384, 6 heads, sequences of 128, vocabulary 6144, an untied LM head, no dropout: 15.4M parameters,
batch 4) and a BatchNorm CNN built with ravdl layers (3 conv-relu-batchnorm-maxpool stages, 32-64-128 channels, a
dense head: 0.6M parameters, batch 32).

    python benchmarks/bench_real_models.py [--models resnet18,gpt,cnn] [--steps 20] [--repeats 2]
                                           [--sides engine,eager,compiled] [--workers 2]

Each side trains the model from the same initial weights on the same batches (fit's shuffled order), with Adam
(lr 1e-3) as torch's fused kernel on both sides (`torch.optim.Adam(fused=True)`; ravdl's `Adam(fused=True)` runs
that kernel), with the torch threads each embedded worker gets (the machine's cores over the workers: 1 on 2 cores
with the default 2 workers) in every process:
- engine: in a fresh process, `R.initialize(workers=N)` (the embedded server and N local workers: the user's
  state, with an empty data directory, $RAVOP_DATA_DIR, as after installing), then
  `Pytorch_Model(R.model(module)).fit` (the CNN: `NeuralNetwork(...).fit`), `R.activate`, `R.execute`,
  `R.track_progress`, every loss fetched (`R.fetch_losses`). Its s/step is the whole of that (record to the last
  loss read) over the steps. Its `steady` s/step is what a step adds, measured after it in the same process, on
  workers that have loaded the model: `R.execute` to done at --steps less at half of them, over the difference
  (when each loss becomes readable says little: the worker's writes queue behind its checkpoints; and fresh
  processes differ by their seconds-long model check more than by 10 steps). A run of more than 22 steps also
  includes the step compiler's trial of the plain step (ravop/runtime/step_compiler.py);
  Beside both, CPU seconds: of the run in all the engine's processes (requester, server, workers, and the children
  they waited for: the model check's sandbox), and what a steady step adds in them; other work on a shared machine
  changes them less than the seconds;
- eager: in a fresh process, the training loop of plain PyTorch; s/step is the loop's time over the steps, `steady`
  the pace from the second step's end to the last (and their CPU seconds);
- compiled: the same with `torch.compile(model)` (Inductor), and its compile seconds (the first two steps' excess
  over the steady pace).
The sides alternate (engine, eager, compiled, engine, ...) and the best of `--repeats` is kept (the run least
disturbed by other work on the machine). Memory: this process samples, every 0.1 s, the proportional set size
(PSS, /proc/PID/smaps_rollup: shared pages split between the processes sharing them) of the side's process and
all its descendants (for the engine: requester, server, fork server, workers) and keeps the peak of the sum; and
the sum of their VmHWM (each process's peak resident size, shared pages counted in each), read by the side just
before it ends. Losses: the max |engine - eager| (and |compiled - eager|) over the first 20 steps.

This driver imports neither torch nor ravop (its pages would be shared with the sides' and lower their PSS).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from ravop.core.cpu_threads import per_worker  # noqa: E402   (imports no torch)

SEED = 0
LR = 1e-3
COMPARED_LOSSES = 20
MODELS = {   # name -> (batch, description)
    "resnet18": (16, "torchvision resnet18, 3x32x32, batch 16"),
    "gpt": (4, "GPT 6x384, seq 128, vocab 6144, batch 4"),
    "cnn": (32, "ravdl BatchNorm CNN, 3x32x32, batch 32"),
}
GPT_SHAPE = {"vocab": 6144, "seq": 128, "d_model": 384, "heads": 6, "layers": 6, "dropout": 0.0, "tied": False}


# ------------------------------------------------------------------------------------------ memory (driver)

def _parents() -> dict[int, int]:
    """Every live process's parent id, from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue   # it ended while we looked
    return parents


def _descendants(root: int, parents: dict[int, int]) -> list[int]:
    """`root` and every live process below it."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _role(pid: int, root: int, parents: dict[int, int]) -> str:
    """What a process of the tree is: the side's own process (eager's, or the engine's requester), the server (not
    Python), the fork server (forked from the requester: it keeps the requester's command line), a worker (a
    `python -m worker`, or forked by the fork server), or something a worker started (the sandbox that checks a
    TorchScript model before the worker loads it)."""
    if pid == root:
        return "requester"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "sandbox and others"   # it ended while we looked
    if b"python" not in os.path.basename(argv[0]):
        return "server"
    if b"worker" in argv or parents.get(parents.get(pid, 0)) == root:
        return "workers"
    return "fork server" if parents.get(pid) == root else "sandbox and others"


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class PeakPss:
    """The peak over time of the summed PSS of a process tree, and of each role's part (`_role`), sampled every
    `interval` seconds in a thread."""

    def __init__(self, root: int, interval: float = 0.1) -> None:
        self.root, self.interval, self.peak_kib, self.processes = root, interval, 0, 0
        self.roles: dict[str, int] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(self.interval):
            parents = _parents()
            pids = _descendants(self.root, parents)
            parts: dict[str, int] = {}
            for pid in pids:
                role = _role(pid, self.root, parents)
                parts[role] = parts.get(role, 0) + _pss_kib(pid)
            self.peak_kib = max(self.peak_kib, sum(parts.values()))
            for role, kib in parts.items():
                self.roles[role] = max(self.roles.get(role, 0), kib)
            self.processes = max(self.processes, len(pids))

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        return self.peak_kib / 1024


def run_side(side: str, model: str, args: argparse.Namespace) -> dict:
    """One side's run in a fresh process: its JSON result, with `pss_mib` (the sampled peak), `processes` and
    `roles` (each role's peak) added."""
    command = [sys.executable, __file__, "--side", side, "--models", model, "--steps", str(args.steps),
               "--workers", str(args.workers), "--threads", str(args.threads)]
    # A fresh data directory: the embedded server loads the data directory's saved store at start, and the shared
    # default (~/.local/share/ravop) holds whatever earlier sessions left (1.7 GB of other benchmarks' tensors here)
    data_dir = tempfile.mkdtemp(prefix="bench-real-models-")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "RAVOP_DATA_DIR": data_dir}
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        peak = PeakPss(proc.pid)
        first = proc.stdout.readline()   # the measured run's result (a JSON line): its memory is the peak so far
        while first and not first.startswith("{"):
            first = proc.stdout.readline()
        pss = peak.stop()
        out, err = proc.communicate()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} {model} failed ({proc.returncode}):\n{err[-3000:]}")
    result = json.loads(first)
    if out.strip():   # the engine's steady pace, measured after the run
        result.update(json.loads(out.strip().splitlines()[-1]))
    result.update(pss_mib=pss, processes=peak.processes, roles={k: v / 1024 for k, v in peak.roles.items()})
    return result


# ------------------------------------------------------------------------------------------ the sides (children)

def _vmhwm_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        except (OSError, StopIteration):
            continue
    return total / 1024


def _cpu_seconds(pids: list[int]) -> float:
    """The CPU seconds (user and system) `pids` used, and their children that ended and were waited for."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                total += sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:15])
        except (OSError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def _tree_cpu() -> float:
    return _cpu_seconds(_descendants(os.getpid(), _parents()))


def _data(model: str, steps: int) -> tuple[Any, Any, int]:
    """(X, y, batch) of `steps` batches: random images and labels, or random token sequences and their shifts."""
    import torch
    batch = MODELS[model][0]
    g = torch.Generator().manual_seed(SEED)
    if model == "gpt":
        tokens = torch.randint(0, GPT_SHAPE["vocab"], (steps * batch, GPT_SHAPE["seq"] + 1), generator=g)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), batch
    return torch.randn(steps * batch, 3, 32, 32, generator=g), torch.randint(0, 10, (steps * batch,), generator=g), batch


def _torch_model(model: str) -> Any:
    """The model as a torch module, initialised from the seed (the same weights on every side)."""
    import torch
    from torch import nn
    sys.path.insert(0, str(HERE))
    import real_models
    torch.manual_seed(SEED)
    if model == "resnet18":
        return real_models.resnet18(num_classes=10)
    if model == "gpt":
        return real_models.GPT(**GPT_SHAPE)
    layers = []
    for cin, cout in ((3, 32), (32, 64), (64, 128)):
        layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(cout, eps=1e-5, momentum=0.1),
                   nn.MaxPool2d(2)]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10))


def _eager_loss(model: str) -> Callable[[Any, Any], Any]:
    import torch.nn.functional as F
    if model == "gpt":
        return lambda out, y: F.cross_entropy(out.reshape(-1, GPT_SHAPE["vocab"]), y.reshape(-1))
    return F.cross_entropy


def eager_side(model: str, steps: int, compiled: bool) -> dict:
    import numpy as np
    import torch
    module = _torch_model(model).train()
    X, y, batch = _data(model, steps)
    order = torch.from_numpy(np.random.default_rng(SEED).permutation(len(X)))   # fit's order for this seed
    optimizer = torch.optim.Adam(module.parameters(), lr=LR, fused=True)
    loss_function = _eager_loss(model)
    start, used = time.perf_counter(), time.process_time()
    if compiled:
        module = torch.compile(module)
    losses, marks, cpu = [], [time.perf_counter()], [time.process_time()]
    for i in range(0, len(X), batch):
        rows = order[i:i + batch]
        loss = loss_function(module(X[rows]), y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        marks.append(time.perf_counter())
        cpu.append(time.process_time())
    seconds, used = time.perf_counter() - start, time.process_time() - used
    steady = _steady(marks[1:])
    return {"seconds": seconds, "steady": steady, "compile": marks[2] - marks[0] - 2 * steady, "losses": losses,
            "steady_cpu": _steady(cpu[1:]), "cpu": used}


def _steady(done_at: list[float]) -> float:
    """Seconds per step from the second step's end to the last one's (`done_at`: when each step ended): the
    steps' pace once the first ones (compiling, warming caches) are behind."""
    if len(done_at) < 3:
        raise ValueError(f"--steps must be at least 3 to time steady steps, not {len(done_at)}")
    return (done_at[-1] - done_at[1]) / (len(done_at) - 2)


def _ravdl_cnn(module: Any) -> Any:
    """The CNN of `_torch_model('cnn')` as a ravdl NeuralNetwork with the torch module's initial weights."""
    from ravdl.v2 import NeuralNetwork
    from ravdl.v2.layers import Activation, BatchNormalization2D, Conv2D, Dense, Flatten, MaxPooling2D
    from ravdl.v2.optimizers import Adam
    network = NeuralNetwork(optimizer=Adam(lr=LR, fused=True), loss="CrossEntropy")
    first = True
    for layer in module:
        name = type(layer).__name__
        if name == "Conv2d":
            network.add(Conv2D(layer.in_channels, layer.out_channels, 3, padding=1,
                               initial_W=layer.weight.detach().numpy(), initial_w0=layer.bias.detach().numpy(),
                               **({"input_shape": (3, 32, 32)} if first else {})))
            first = False
        elif name == "ReLU":
            network.add(Activation("relu"))
        elif name == "BatchNorm2d":
            network.add(BatchNormalization2D(layer.num_features, momentum=0.1, epsilon=1e-5))
        elif name == "MaxPool2d":
            network.add(MaxPooling2D(2))
        elif name == "Flatten":
            network.add(Flatten())
        else:
            network.add(Dense(layer.out_features, initial_W=layer.weight.detach().numpy(),
                              initial_w0=layer.bias.detach().numpy()))
    return network


def engine_side(model: str, steps: int, workers: int) -> dict:
    import contextlib
    import io
    import torch
    import ravop as R
    from ravdl.v2 import Pytorch_Model
    from ravdl.v2.optimizers import Adam
    R.initialize(workers=workers)
    X, y, batch = _data(model, steps)
    R.Graph(name="warm-up")   # not timed: the modules that R's names and recording load on first use
    R.model(torch.nn.Linear(2, 2))
    module = _torch_model(model)   # the user's module, made as eager's is, before the clock starts

    def record(rows: int) -> None:
        R.Graph(name=f"bench {model} {rows}", seed=SEED)
        with contextlib.redirect_stdout(io.StringIO()):   # a model summary
            if model == "cnn":
                network = _ravdl_cnn(module)
                network.fit(X[:rows].numpy(), y[:rows].numpy(), n_epochs=1, batch_size=batch, shuffle=True, seed=SEED)
            else:
                network = Pytorch_Model(R.model(module))
                network.initialize(Adam(lr=LR, fused=True))
                vocab = GPT_SHAPE["vocab"]
                loss = "CrossEntropy" if model != "gpt" else \
                    (lambda y_true, y_pred: R.cross_entropy_loss(y_true, y_pred, reshape_target=(-1, vocab),
                                                                 reshape_label=(-1,)))
                network.fit(X[:rows], y[:rows], n_epochs=1, batch_size=batch, loss=loss, shuffle=True, seed=SEED)

    times = {}
    start, used = time.perf_counter(), _tree_cpu()
    record(len(X))
    times["record"] = time.perf_counter() - start
    mark = time.perf_counter()
    R.activate()
    times["activate"] = time.perf_counter() - mark
    mark = time.perf_counter()
    R.execute()
    R.track_progress(progress_bar=False)
    times["loop"] = time.perf_counter() - mark
    mark = time.perf_counter()
    losses = [float(v) for v in R.fetch_losses().batch]
    times["fetch"] = time.perf_counter() - mark
    seconds = time.perf_counter() - start
    result = {"seconds": seconds, "phases": times, "losses": losses, "cpu": _tree_cpu() - used,
              "parameters": sum(p.numel() for p in module.parameters())}
    _report(result)   # the driver stops sampling memory here: what follows trains more graphs
    # What a step adds on warm workers (each has checked and loaded the model: a multi-second cost whose variance
    # hides the steps' time when runs in fresh processes are compared): the loop at `steps` less at half of them,
    # twice each (the loop may land on either worker), the least disturbed of each.
    # Their CPU seconds too (all the engine's processes: the requester, server and workers), which other work on
    # the machine changes less than the seconds.
    loops: dict[int, float] = {}
    cpu: dict[int, float] = {}
    for n in (steps // 2, steps, steps // 2, steps):
        record(n * batch)
        R.activate()
        mark, used = time.perf_counter(), _tree_cpu()
        R.execute()
        R.track_progress(progress_bar=False)
        loops[n] = min(loops.get(n, float("inf")), time.perf_counter() - mark)
        cpu[n] = min(cpu.get(n, float("inf")), _tree_cpu() - used)
    half = steps - steps // 2
    return {"steady": (loops[steps] - loops[steps // 2]) / half, "steady_cpu": (cpu[steps] - cpu[steps // 2]) / half}


def _report(result: dict) -> None:
    """A JSON line for the driver, with the sum of the VmHWM of this process and all below it so far."""
    result["vmhwm_mib"] = _vmhwm_mib(_descendants(os.getpid(), _parents()))
    print(json.dumps(result), flush=True)


def side_main(args: argparse.Namespace) -> None:
    import torch
    torch.set_num_threads(args.threads)
    model = args.models
    if args.side == "engine":
        print(json.dumps(engine_side(model, args.steps, args.workers)))
    else:
        _report(eager_side(model, args.steps, args.side == "compiled"))


# ------------------------------------------------------------------------------------------ the table

def loss_gap(a: list[float], b: list[float]) -> float:
    n = min(COMPARED_LOSSES, len(a), len(b))
    return max(abs(x - y) for x, y in zip(a[:n], b[:n]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,gpt,cnn")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sides", default="engine,eager,compiled")
    parser.add_argument("--workers", type=int, default=2, help="the embedded default's local workers")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads in each process (default and only choice: what each of the embedded "
                             "default's workers gets, the machine's cores over --workers)")
    parser.add_argument("--side", choices=("engine", "eager", "compiled"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads is None:
        args.threads = per_worker(args.workers)
    if args.side:
        return side_main(args)
    if args.threads != per_worker(args.workers):
        parser.error(f"the embedded default runs {per_worker(args.workers)} torch thread(s) in each of {args.workers} "
                     f"worker(s) here: eager with --threads {args.threads} would compare another thread count (other "
                     "speed, other bits); change --workers instead")
    models, sides = args.models.split(","), args.sides.split(",")
    unknown = [m for m in models if m not in MODELS] + [s for s in sides if s not in ("engine", "eager", "compiled")]
    if unknown or "eager" not in sides:
        parser.error(f"unknown models or sides {unknown}; the sides must include eager" if unknown else
                     "the sides must include eager (every ratio is to it)")
    print(f"{args.steps} steps, best of {args.repeats}, {args.threads} torch thread(s) a process, "
          f"engine on {args.workers} local worker(s); load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for model in models:
        runs: dict[str, list[dict]] = {s: [] for s in sides}
        for _ in range(args.repeats):
            for side in sides:
                run = run_side(side, model, args)
                runs[side].append(run)
                print(f"  ({side}: {run['seconds'] / args.steps:.3f} s/step (CPU {run['cpu'] / args.steps:.3f} s), "
                      f"steady {run['steady']:.3f}, peak PSS "
                      f"{run['pss_mib']:,.0f} MiB)", flush=True)
        best = {s: min(r, key=lambda x: x["seconds"]) for s, r in runs.items()}
        peak = {s: min(x["pss_mib"] for x in r) for s, r in runs.items()}
        hwm = {s: min(x["vmhwm_mib"] for x in r) for s, r in runs.items()}
        eager, eager_steady = best["eager"]["seconds"] / args.steps, best["eager"]["steady"]
        print(f"\n{MODELS[model][1]}: s/step (whole run / steps, x eager's), steady s/step (eager's, compiled's: from "
              f"step 2's end; the engine's: its loop on warm workers at {args.steps} steps less at {args.steps // 2})")
        for side in sides:
            b = best[side]
            per_step = b["seconds"] / args.steps
            line = f"  {side:<9}{per_step:7.3f} s/step {per_step / eager:5.2f}x (CPU {b['cpu'] / args.steps:.3f} s " \
                   f"{b['cpu'] / best['eager']['cpu']:4.2f}x)  steady {b['steady']:.3f} {b['steady'] / eager_steady:5.2f}x"
            if "steady_cpu" in b:
                line += f" (CPU {b['steady_cpu']:.3f} s {b['steady_cpu'] / best['eager']['steady_cpu']:4.2f}x)"
            if side == "compiled":
                line += f"  (compile {b['compile']:.1f} s)"
            if side == "engine":
                ph = b["phases"]
                line += f"  (record {ph['record']:.2f}, activate {ph['activate']:.2f}, execute to done " \
                        f"{ph['loop']:.2f}, fetch {ph['fetch']:.2f} s; {b['parameters'] / 1e6:.1f}M parameters)"
                if "compiled" in best:
                    line += f"  vs compiled: {b['seconds'] / best['compiled']['seconds']:.2f}x, steady " \
                            f"{b['steady'] / best['compiled']['steady']:.2f}x"
            print(line)
            gap = "" if side == "eager" else f"; max |loss - eager's| over the first {COMPARED_LOSSES}: " \
                                             f"{loss_gap(b['losses'], best['eager']['losses']):.1e}"
            print(f"  {'':<9}peak PSS {peak[side]:6,.0f} MiB {peak[side] / peak['eager']:5.2f}x, sum of VmHWM "
                  f"{hwm[side]:6,.0f} MiB {hwm[side] / hwm['eager']:5.2f}x, {max(x['processes'] for x in runs[side])} "
                  f"processes{gap}")
            if side == "engine":
                roles = min(runs[side], key=lambda x: x["pss_mib"])["roles"]
                print(f"  {'':<9}each role's peak PSS: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(roles.items()) if v >= 1)
                      + " MiB", flush=True)
    print(f"\nload {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
