"""Make a loop's step template cheaper per run, bit for bit: a step compiler over a built `Runner`.

A step template runs hundreds of times with the same ops on the same shapes, so work that eager PyTorch (and
the plain runner) repeats every step can be done once, and per-op Python work can be merged. Every rewrite here
computes the same bits as the op it replaces, so the plain and the compiled step are interchangeable at any run:
a loop may switch between them, a worker that compiles and one that does not give the same numbers, and a
retry resumes from a checkpoint either way. Rewrites that change the bits (Inductor's fusions, which reorder
float arithmetic) are not made: whether they are used would depend on which worker measured what, and the same
graph and seed must give the same numbers on any worker.

The rewrites are declared by the ops they concern (ravop/core/registry.py: `group_update`, `reuses`,
`cpu_variant`, their kernels beside the op's), and this module is an engine over them (`RULES`, one entry per
kind of declaration; no op is named here). Each keeps the call list's length and order, and each op's output:
the memory watcher, op tracing and error messages see the same ops; those whose bits were checked on CPU kernels
only are made on a CPU only. Today's declarations:
- (CPU) optimizer steps with the same settings (Adam and AdamW updating in place, where the loop owns their
  values; RMSprop) become one update of all their tensors, run at the first of them; the others hand out their
  part (`group_update`). Adam's is the op's own update (`fused=True`: torch's fused kernel, one call with every
  tensor; else torch's single-tensor loop) over every tensor: each tensor is updated on its own either way;
  RMSprop's is `torch._foreach_*`, whose kernels loop over the tensors in C++ with the same per-tensor kernels as
  the op's.
- a backward op reuses what its forward computed in the same run instead of computing it again (`reuses`): a
  dropout's mask (autodiff records the redraw from the same seed so that no mask is stored between workers;
  inside one step it is kept); (CPU) a batch norm's batch statistics (mean, inverse std: ATen computes them with
  the same kernel either way); (CPU) a cross-entropy loss's log-probabilities and total weight (class-index
  targets; the forward made as F.cross_entropy makes them: log_softmax, then nll_loss); (CPU) a TorchScript
  model's autograd graph (its forward run once, under autograd, for the VJP that would run it again).
- (CPU) a faster kernel with the same bits (`cpu_variant`): 2-d max pooling with indices on a channels-last copy
  of its input (ATen's NCHW kernel is several times slower on small images), handing back contiguous values and
  indices: the same maxima and the same (first-in-window) indices.
- projections (the op of kind PROJECTION) are bound to `operator.itemgetter`, and the compiled step runs each
  such projection right after the op that makes its tuple (`Compiled.plan`: one pass of the runner's loop per
  op, the same values, frees, memory limits and errors).

In the reproducible numerics mode (ravop/core/numerics_mode.py) the runner binds each op's `reproducible` kernel,
and every rewrite above applies only to a call still bound to the op's own kernel: only ops whose mode kernel is
their own (dropout, max pooling) are rewritten, so no default kernel comes back (tests/ops/test_reproducible_numerics.py).

Which runs faster is measured, not assumed (`Tuned`): after a warm-up the step alternates between the plain and
the compiled calls for a few runs each, keeps the faster, and the decision is kept per template digest and
machine (`Decisions`; a worker keeps them on disk with its calibration figures) so that the next loop of the
same template starts with the faster one. A template whose compilation fails runs plain, with the reason
logged. On a CUDA device a step that nothing changes on the host from run to run is captured as one CUDA graph
at its first run (ravop/runtime/step_capture.py).
"""
from __future__ import annotations

import functools
import hashlib
import logging
import operator
import os
import time
from typing import Any, Callable, Optional, Protocol, Sequence

from ..core import registry
from .runner import At, PerRun, PlanEntry, Runner, check_in_place
from .step_capture import CapturedStep, blockers, cuda_capture

log = logging.getLogger(__name__)

DISABLE_ENV = "RAVOP_STEP_COMPILER"   # "off": every step runs plain (a reference for tests and debugging)
WARM_UP_RUNS = 2       # runs before timing: first calls allocate and warm caches
TRIAL_RUNS = 10        # timed runs of each variant, alternating; the fastest of each is compared (the
                       # least disturbed by other work on the machine)
MIN_GAIN = 0.03        # the compiled step must be this much faster to be kept (timer noise)


def enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("off", "0", "false", "no")


# ------------------------------------------------------------------------------------------------ decisions

class Decisions(Protocol):
    """Where decisions are kept: `load(key)` -> {"compiled": 0 or 1, ...} or None; `store(key, figures)`."""

    def load(self, key: str) -> Optional[dict[str, float]]: ...

    def store(self, key: str, figures: dict[str, float]) -> None: ...


class MemoryDecisions:
    """Decisions kept for the life of the process (in-process evaluation, tests)."""

    def __init__(self) -> None:
        self.figures: dict[str, dict[str, float]] = {}

    def load(self, key: str) -> Optional[dict[str, float]]:
        return self.figures.get(key)

    def store(self, key: str, figures: dict[str, float]) -> None:
        self.figures[key] = dict(figures)


IN_PROCESS = MemoryDecisions()


def template_digest(nodes: list[Any], inputs: list[int], device: str) -> str:
    """A digest of a step's ops (op names, params, declared shapes and dtypes, and which op reads which value,
    by position, not by id) and its device: the same model on the same batch shape gives the same digest in
    any graph."""
    position = {i: ("in", k) for k, i in enumerate(inputs)}
    h = hashlib.sha256(device.encode())
    for index, node in enumerate(nodes):
        position[node.id] = ("op", index)
        params = node.pkey or repr(sorted(node.params.items())).encode()
        h.update(repr((node.op, [position.get(i) for i in node.inputs], str(node.shape), str(node.dtype))).encode())
        h.update(params)
    return h.hexdigest()[:32]


# ------------------------------------------------------------------------------------------------ rewrites

class Compiled:
    """The compiled calls of a runner (same length and order) and what was rewritten; `run` runs them with
    each projection of a tuple folded into the op that makes the tuple (`plan`, made once from `calls`: code
    that wraps calls gives the runner a new list, and `Tuned` then runs that list as it is)."""

    def __init__(self, calls: list[Any], rewrites: dict[str, int], overwrites: dict[int, tuple[int, ...]]) -> None:
        self.calls, self.rewrites, self.overwrites = calls, rewrites, overwrites
        self.plan = _fold_projections(calls)

    def run(self, runner: Runner, at: Optional[At]) -> list[Any]:
        """A run of `runner` over `plan`: the same calls, values, frees, memory checks and errors (naming the
        same op), without a pass of the runner's loop per projection (a step of a small model has more
        projections than ops)."""
        return runner.run(at, self.plan)


def _fold_projections(calls: list[Any]) -> list[PlanEntry]:
    """`calls` as a plan (`Runner.run`): an op whose output only bound projections (`operator.itemgetter`, see
    `_bind_projections`) read carries them ((getter, their slot, their index), in order) and frees what they
    free; they have no entry of their own. A projection's value is defined once its tuple is (each value has
    its own slot), and nothing else reads the tuple, so setting it earlier and freeing the tuple with the op
    changes no value any call sees."""
    readers: dict[int, list[int]] = {}
    for index, (_, args, *_) in enumerate(calls):
        for a in args:
            readers.setdefault(a, []).append(index)
    projection = {index for index, (kernel, args, _, _, _, varies) in enumerate(calls)
                  if type(kernel) is operator.itemgetter and varies is None and len(args) == 1}
    plan: list[PlanEntry] = []
    folded: set[int] = set()
    for index, call in enumerate(calls):
        if index in folded:
            continue
        kernel, args, params, out, frees, varies = call
        read_by = readers.get(out, [])
        if index in projection or not read_by or not all(r in projection and r > index for r in read_by):
            plan.append((index, call, ()))
            continue
        frees = tuple(frees) + tuple(s for r in read_by for s in calls[r][4])
        plan.append((index, (kernel, args, params, out, frees, varies), tuple((calls[r][0], calls[r][3], r)
                                                                              for r in read_by)))
        folded.update(read_by)
    return plan


def compile_calls(runner: Runner) -> Compiled:
    """The rewrites the ops of `runner` declare (`RULES`) applied to a copy of `runner.calls`."""
    calls = list(runner.calls)
    overwrites = dict(runner.overwrites)
    opdefs = [registry.REGISTRY[node.op] for node in runner.nodes]
    on_cpu = runner.device == "cpu"   # the same bits checked on CPU kernels only (a GPU's may fuse differently)
    rewrites = dict.fromkeys(rewrite_names(), 0)
    for apply in RULES.values():
        for name, made in apply(runner, opdefs, calls, overwrites, on_cpu).items():
            rewrites[name] += made
    # the rewritten list keeps the plain one's in-place contract (owned: what the plain list may overwrite)
    check_in_place(calls, overwrites, set().union(*runner.overwrites.values()), runner.kept, runner.nodes)
    return Compiled(calls, rewrites, overwrites)


def rewrite_names() -> list[str]:
    """What the rewrites are counted as (`Compiled.rewrites`): every name the ops declare, and projections."""
    names = {getattr(opdef, field).name for opdef in registry.unique_opdefs() for field in DECLARED
             if getattr(opdef, field) is not None}
    return sorted(names) + [PROJECTIONS]


Counts = dict[str, int]
OpDefs = Sequence[registry.OpDef]


def _bind_projections(runner: Runner, opdefs: OpDefs, calls: list[Any], overwrites: Any, on_cpu: bool) -> Counts:
    n = 0
    for index, opdef in enumerate(opdefs):
        kernel, args, params, out, frees, varies = calls[index]
        if opdef.is_projection and varies is None and type(params.get(registry.PICKS)) is int and len(params) == 1:
            calls[index] = (operator.itemgetter(params[registry.PICKS]), args, {}, out, frees, None)
            n += 1
    return {PROJECTIONS: n}


def _cpu_variants(runner: Runner, opdefs: OpDefs, calls: list[Any], overwrites: Any, on_cpu: bool) -> Counts:
    counts: Counts = {}
    for index, opdef in enumerate(opdefs):
        variant = opdef.cpu_variant
        kernel, args, params, out, frees, varies = calls[index]
        if variant is not None and on_cpu and varies is None and kernel is opdef.kernel:
            calls[index] = (variant.kernel, args, params, out, frees, None)
            counts[variant.name] = counts.get(variant.name, 0) + 1
    return counts


def _reuse_forwards(runner: Runner, opdefs: OpDefs, calls: list[Any], overwrites: Any, on_cpu: bool) -> Counts:
    """Pair each backward op that `reuses` its forward with that forward in the same run (`registry.Reuses`): the
    forward runs its keeping kernel, the backward its kept one, over one box."""
    reusing: dict[int, list[registry.Reuses]] = {}   # id of a forward's OpDef -> the declarations naming it
    for opdef in registry.unique_opdefs():
        if opdef.reuses is not None:
            reusing.setdefault(id(registry.get(opdef.reuses.forward)), []).append(opdef.reuses)
    index_of = {node.id: index for index, node in enumerate(runner.nodes)}
    latest: dict[tuple[int, tuple[int, ...]], int] = {}   # (declaration, the values it reads) -> forward's index
    boxes: dict[int, tuple[registry.Reuses, list[Any]]] = {}   # forward's index -> (declaration, box)
    counts: Counts = {}
    for index, opdef in enumerate(opdefs):
        kernel, args, params, out, frees, varies = calls[index]
        for of_it in reusing.get(id(opdef), ()):   # it is a forward: the latest one reading these values
            if of_it.reads and kernel is opdef.kernel and varies is None and len(args) > max(f for _, f in of_it.reads):
                latest[(id(of_it), tuple(args[f] for _, f in of_it.reads))] = index
        reuses = opdef.reuses
        if reuses is None or (reuses.cpu_only and not on_cpu) or kernel is not opdef.kernel:
            continue
        forward = _forward_of(reuses, opdef, index, calls, opdefs, index_of, latest)
        if forward is None:
            continue
        f_kernel, f_args, f_params, f_out, f_frees, f_varies = calls[forward]
        full, f_full = {**opdef.params, **params}, {**opdefs[forward].params, **f_params}
        if any(full[k] != f_full[k] for k in reuses.same) or (reuses.applies is not None and not reuses.applies(full)):
            continue
        declared, box = boxes.get(forward, (reuses, None))
        if declared is not reuses:   # kept for another kind of backward already
            continue
        if box is None:
            box = [None] if reuses.box is None else reuses.box(full)
            boxes[forward] = (reuses, box)
            calls[forward] = (functools.partial(reuses.keeping, box), f_args, f_params, f_out, f_frees, f_varies)
        # a backward following a stream keeps its per-run seed: a forward that did not draw leaves the redraw to it
        calls[index] = (functools.partial(reuses.kept, box), args, params, out, frees, varies)
        counts[reuses.name] = counts.get(reuses.name, 0) + 1
    return counts


def _forward_of(reuses: registry.Reuses, opdef: registry.OpDef, index: int, calls: list[Any], opdefs: OpDefs,
                index_of: dict[int, int], latest: dict[tuple[int, tuple[int, ...]], int]) -> Optional[int]:
    """The index of the call whose values the backward at `index` may reuse, or None."""
    kernel, args, params, out, frees, varies = calls[index]
    if opdef.seed_param is None:   # the latest forward before it reading the same values
        if varies is not None or len(args) <= max(b for b, _ in reuses.reads):
            return None
        return latest.get((id(reuses), tuple(args[b] for b, _ in reuses.reads)))
    # the forward whose random stream its seed follows, drawing as the plain step draws it
    if varies is None or varies.seed_from is None or varies.counted is not None:
        return None
    source, stride = varies.seed_from
    forward = index_of.get(source)
    if forward is None or forward >= index or opdefs[forward] is not registry.get(reuses.forward):
        return None
    f_kernel, _, _, _, _, f_varies = calls[forward]
    # a forward seeding its own draws (a TorchScript model's dropout) follows its own stream, as the backward does
    if f_kernel is not opdefs[forward].kernel or type(f_varies) is not PerRun or f_varies.stream != source or \
            f_varies.stride != stride or f_varies.counted is not None or \
            f_varies.seed_from not in (None, (source, stride)):
        return None
    return forward


# ---- groups of updates (optimizer steps)

class _Group:
    """The kernel of the first call of a group: runs `update` (an op's `GroupUpdate.kernel`) over every member's
    tensors, keeps their results in `box` (the members after it hand theirs out), returns its own."""
    __slots__ = ("box", "update")

    def __init__(self, update: Callable[..., list[tuple[Any, ...]]], n: int) -> None:
        self.update = update
        self.box: list[Any] = [None] * n

    def __call__(self, *args: Any, **params: Any) -> Any:
        self.box[:] = self.update(args, **params)
        return self.box[0]


def _settings(opdef: registry.OpDef, params: dict[str, Any]) -> Optional[str]:
    full = {**opdef.params, **params}
    covers = opdef.group_update.covers   # type: ignore[union-attr]
    if (covers is not None and not covers(full)) or \
            any(v is registry.REQUIRED for k, v in full.items() if k != opdef.counter):
        return None
    return repr(sorted((k, v) for k, v in full.items() if k != opdef.counter))


def _group_updates(runner: Runner, opdefs: OpDefs, calls: list[Any], overwrites: dict[int, tuple[int, ...]],
                   on_cpu: bool) -> Counts:
    """Group the calls of ops declaring a `group_update` with the same settings and step counter into one update;
    the group's call overwrites what its members did (`overwrites`)."""
    n_inputs = runner.n_inputs
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, opdef in enumerate(opdefs):
        group = opdef.group_update
        if group is None or (group.cpu_only and not on_cpu):
            continue
        kernel, args, params, out, frees, varies = calls[index]
        wanted = opdef.in_place.kernel if group.in_place else opdef.kernel   # type: ignore[union-attr]
        if kernel is not wanted or len(args) != len(opdef.inputs):
            continue   # Adam on copies (the loop does not own these values): left alone
        settings = _settings(opdef, params)
        counted = None if varies is None else varies.counted
        step = None if opdef.counter is None else params.get(opdef.counter)
        if settings is None or (varies is not None and (type(varies) is not PerRun or varies.seed_from is not None)) \
                or (varies is None and opdef.counter is not None and type(step) is not int):
            continue
        key = (opdef, settings, counted, None if varies is not None else step)
        groups.setdefault(key, []).append(index)
    counts: Counts = {}
    for members in groups.values():
        opdef = opdefs[members[0]]
        group = opdef.group_update
        positions = opdef.in_place.overwritten if group.in_place else ()   # type: ignore[union-attr]
        if len(members) < 2 or not _groupable(runner, calls, members, n_inputs, positions):
            continue
        first = members[0]
        update = _Group(group.kernel, len(members))   # type: ignore[union-attr]
        kernel, args, params, out, frees, varies = calls[first]
        every = tuple(a for m in members for a in calls[m][1])
        calls[first] = (update, every, params, out, frees, varies)
        if first in overwrites:
            overwrites[first] = tuple(s for m in members for s in overwrites.pop(m, ()))
        for k, m in enumerate(members[1:], 1):
            _, _, _, out_m, frees_m, _ = calls[m]
            calls[m] = (functools.partial(operator.getitem, update.box, k), (), {}, out_m, frees_m, None)
        name = group.name   # type: ignore[union-attr]
        counts[name] = counts.get(name, 0) + 1
    return counts


def _groupable(runner: Runner, calls: list[Any], members: list[int], n_inputs: int,
               overwrites: Sequence[int]) -> bool:
    """Whether running every member at the first one's place changes nothing: each reads only values made
    before that place, the values they overwrite are distinct and read by nothing else, and nothing between
    the first and the last member reads them."""
    first = members[0]
    overwritten = [calls[m][1][p] for m in members for p in overwrites]
    if len(set(overwritten)) != len(overwritten):
        return False
    targets = set(overwritten)
    for m in members:
        args = calls[m][1]
        if any(a >= n_inputs and a - n_inputs >= first for a in args):
            return False   # made after the first member
        if any(a in targets for k, a in enumerate(args) if k not in overwrites):
            return False
    chosen = set(members)
    for index in range(first, members[-1]):
        if index not in chosen and any(a in targets for a in calls[index][1]):
            return False
    return True


# The rule table: the OpDef field (or kind) an op declares a rewrite with -> the function making every such
# declaration in a call list (`(runner, its nodes' OpDefs, the calls, their overwrites, on a CPU)` -> the rewrites
# made, by name), in this order. The rewrites touch distinct calls: each one's own op's, its kernel as registered.
PROJECTIONS = "projections"
DECLARED = ("group_update", "reuses", "cpu_variant")
RULES: dict[str, Callable[[Runner, OpDefs, list[Any], dict[int, tuple[int, ...]], bool], Counts]] = {
    "group_update": _group_updates,
    "reuses": _reuse_forwards,
    "cpu_variant": _cpu_variants,
    "is_projection": _bind_projections,
}


# ------------------------------------------------------------------------------------------------ the choice

class Tuned:
    """A step's runner choosing between its plain calls and the compiled ones by timing them in flight (both
    give the same bits); with a decision already kept for its digest it starts with that one."""

    def __init__(self, runner: Runner, compiled: Compiled, key: str, decisions: Decisions,
                 capture: Optional[tuple[list[int], list[int]]] = None, runs: Optional[int] = None) -> None:
        """`capture`: (input slots, output slots) of a step to capture as a CUDA graph at its first run; `runs`:
        how often the step will run, if known. A step that runs too few times to be measured (a fit's short
        last batch runs once an epoch) runs compiled, undecided: the same bits, with the work the rewrites save."""
        self.runner, self.compiled, self.key, self.decisions = runner, compiled, key, decisions
        self.capture = capture
        self.captured: Optional[CapturedStep] = None
        self.plain_calls = runner.calls
        self.times: dict[bool, list[float]] = {False: [], True: []}
        self.runs = 0
        kept = decisions.load(key)
        self.decided: Optional[bool] = None if kept is None else bool(kept.get("compiled"))
        if self.decided is None and runs is not None and runs < WARM_UP_RUNS + 2 * TRIAL_RUNS:
            self.decided = True
        self._use(self.decided is not False)

    def _use(self, compiled: bool) -> None:
        self.runner.calls = self.compiled.calls if compiled else self.plain_calls

    def run(self, at: Optional[At]) -> list[Any]:
        if self.capture is not None:   # once, with the first run's inputs, over the chosen calls
            self.captured = cuda_capture(self.runner, *self.capture)
            self.capture = None
        if self.captured is not None:
            return self.captured.run(at)
        if self.decided is not None:
            return self._run(at)
        self.runs += 1
        if self.runs <= WARM_UP_RUNS:
            self._use(self.runs % 2 == 1)
            return self._run(at)
        compiled = self.runs % 2 == 1
        self._use(compiled)
        start = time.perf_counter()
        values = self._run(at)
        self.times[compiled].append(time.perf_counter() - start)
        if len(self.times[True]) >= TRIAL_RUNS and len(self.times[False]) >= TRIAL_RUNS:
            self._decide()
        return values

    def _run(self, at: Optional[At]) -> list[Any]:
        """A run of the chosen calls: the compiled ones through their plan (calls wrapped since, a new list as
        bench_step's profile makes, run as they are)."""
        if self.runner.calls is self.compiled.calls:
            return self.compiled.run(self.runner, at)
        return self.runner.run(at)

    def _decide(self) -> None:
        plain, compiled = min(self.times[False]), min(self.times[True])
        self.decided = compiled < plain * (1 - MIN_GAIN)
        self._use(self.decided)
        figures = {"compiled": float(self.decided), "plain_us": plain * 1e6, "compiled_us": compiled * 1e6,
                   **{k: float(v) for k, v in self.compiled.rewrites.items()}}
        log.info("step template %s: plain %.0f us, compiled %.0f us per run: %s (%s)", self.key[:12],
                 plain * 1e6, compiled * 1e6, "compiled" if self.decided else "plain", self.compiled.rewrites)
        self.decisions.store(self.key, figures)

    def plain(self) -> None:
        """Run op by op from now on (a traced or instrumented step: hooks wrap the plain calls)."""
        self.decided = False
        self.capture = self.captured = None
        self._use(False)


def tune(runner: Runner, nodes: list[Any], inputs: list[int], decisions: Optional[Decisions],
         holes: Sequence[int] = (), results: Sequence[int] = (), runs: Optional[int] = None) -> Optional[Tuned]:
    """A `Tuned` chooser for `runner` (a step template's, built; `inputs` the ids of its inputs, of which
    `holes` change per run, and `results` the ids it hands out; `runs`: how often it will run, if known), or
    None where nothing applies: compiling off (`$RAVOP_STEP_COMPILER=off`, or `decisions` None), no rewrite found
    and no CUDA graph to capture, or compiling failed (logged)."""
    if decisions is None or not enabled():
        return None
    try:
        compiled = compile_calls(runner)
        capture = None
        if runner.device.startswith("cuda") and not blockers(runner):
            capture = ([runner.slot[i] for i in holes], [runner.slot[i] for i in results])
        if not any(compiled.rewrites.values()) and capture is None:
            return None
        return Tuned(runner, compiled, template_digest(nodes, inputs, runner.device), decisions, capture, runs)
    except Exception as exc:   # a rewrite's bug must never stop a loop: the plain step is always right
        log.warning("step template not compiled, running op by op: %s: %s", type(exc).__name__, exc)
        return None
