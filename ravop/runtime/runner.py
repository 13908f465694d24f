"""The one interpreter: ops built once into a flat list of pre-bound kernel calls over a list of value slots,
and run. Workers run subgraphs and loop steps with it (`ravop.runtime.loop_run`), constant folding and
in-process evaluation (`ravop.runtime.evaluate`) run ops with it, so there is one device rule, one seeding rule, one
memory watcher hook and one error type.

Building a `Runner` looks every op up once: its kernel (on the device, by the rule below), the slots of its
arguments, its params, the slot of its result and the slots nothing reads after it (freed as it goes). A run
then does no decoding, registry lookup or dictionary access per op.

Devices (ravop/core/registry.py, "Devices"): an op that makes tensors from params alone runs with the device as
torch's default device; a random op draws on a host `torch.Generator` seeded by `op_seed(graph_seed, stream)`,
so a CPU and a GPU worker draw the same numbers, and its result is moved. Other kernels follow their inputs,
so they run without torch's device mode, which would add Python work to every torch call they make.

Seeding: a random op's stream is its node id, or, in a loop step, one per run (`stream_id`). An op with a
`seed_param` that follows another op's stream (or its own, its seed being its own stream's), and an op's step
`counter`, are set per run the same way; one listed as following itself whose recorded seed is not its own
stream's draws the stream that seed names, per training step (`step_seed`, `ravop.record.loop.Step.seed_by_step`).

Kernels: each op's own, or in the reproducible numerics mode (`RAVOP_NUMERICS=reproducible`, read when a runner is
built) its `reproducible` kernel; an op without one is refused then (`chosen_kernel`), never run the default way.

A kernel that raises, or whose output the watcher refuses, is reported as an `OpError` naming its node (as
torch.fx's Interpreter does), with the sizes of its inputs; the runner's values are dropped first, so that
memory is free again when the error is handled.

In place: every value is immutable, except where a caller that owns some slots gives an op its in-place variant
(`replace`, with the slots it overwrites: a loop's optimizer steps over its carried values). The contract, checked
by `check_in_place` before such a call list runs: a slot is overwritten only if its owner copied it in (the
caller's tensors are never touched), no call after the overwriting one reads it, it is not a result handed out,
and no call overwrites or reads one slot twice. A list that breaks it is refused (`PlanError`), not run: an
overwritten value read later would give a wrong number with no error.
"""
from __future__ import annotations

from itertools import count, repeat
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Optional, Protocol, Sequence

import torch
from torch import Tensor

from ..core import numerics_mode, registry
from ..core.errors import PlanError, RavopError
from ..core.node import Node
from ..core.registry import OpDef

_MASK = (1 << 64) - 1

Shape = tuple[int, ...]


class OpError(RavopError, RuntimeError):
    """An op's kernel raised, or its output was refused (`over_budget`): `node` is the op (`.op`, `.source`: the
    user's line), `detail` the kernel's error (or the refusal) in one line, `input_shapes` (shape, dtype) of
    each input (None for one that is not a tensor), `step` the loop step's index when it ran in one; the
    kernel's exception is the `__cause__`."""

    def __init__(self, node: Any, detail: str, input_shapes: Sequence[Optional[tuple[Shape, Any]]] = (),
                 step: Optional[int] = None, over_budget: bool = False) -> None:
        source = getattr(node, "source", "")
        super().__init__(f"op {node.op!r}{f' (recorded at {source})' if source else ''}: {detail}")
        self.node, self.detail = node, detail
        self.input_shapes, self.step, self.over_budget = list(input_shapes), step, over_budget


class Watcher(Protocol):
    """What a runner asks of a memory watcher (worker/execute/memory.py): per op, in order, the bytes above which its
    output is looked at, and why an output is refused (None: it is not)."""
    limits: Sequence[int]

    def problem(self, index: int, value: Tensor) -> Optional[str]: ...


class At(NamedTuple):
    """Where a loop step's run stands: training steps run before it, the step's index in the loop, and the
    runs of its template before it."""
    trained: int
    step_index: int
    run: int


def describe(exc: BaseException, node: Any) -> str:
    """`exc` in one line; one that carries no message (a bare StopIteration from odd params) says so."""
    text = str(exc).strip()
    if text:
        return f"{type(exc).__name__}: {text}"
    params = ", ".join(f"{k}={v!r}" for k, v in node.params.items()) or "no params"
    return f"{type(exc).__name__} with no message, raised by the kernel with {params[:300]}"


def op_seed(graph_seed: int, node_id: int) -> int:
    """A 63-bit seed for one op (splitmix64 of the graph seed and the node id: stable across processes)."""
    z = (int(graph_seed) * 0x9E3779B97F4A7C15 + int(node_id) + 1) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) >> 1


def step_seed(seed: int, trained: int) -> int:
    """The seed an op recorded with `seed` under `ravop.record.loop.Step.seed_by_step` runs with, after `trained`
    training steps (counting, in a sync template, the one it follows)."""
    return op_seed(seed, trained)


def stream_id(node_id: int, stride: Optional[int], at: Optional[At]) -> int:
    """The id whose `op_seed(graph_seed, id)` an op draws from: its own id outside a loop; in a step, the
    recorded op id plus `run * stride` in a folded user loop (the unrolled op's own stream), else one of the op
    and the step's index, distinct per run and never an op's own id."""
    if at is None:
        return node_id
    return ((at.step_index + 1) << 32) | node_id if stride is None else node_id + stride * at.run


def run_op(opdef: OpDef, args: list[Any], params: Mapping[str, Any], graph_seed: int = 0, node_id: int = 0,
           device: str = "cpu", kernel: Optional[registry.Kernel] = None) -> Any:
    """Apply one op's kernel (or `kernel`, a variant of a random op's taking the same generator) to tensors
    (`args`, on `device`) with its params; the result is on `device` (the device rule of the module docstring)."""
    kernel = chosen_kernel(opdef, numerics_mode.reproducible()) if kernel is None else kernel
    if opdef.random:
        generator = torch.Generator().manual_seed(op_seed(graph_seed, node_id))
        out = kernel(*args, generator=generator, **params)
        return out if device == "cpu" else _to(out, device)
    if opdef.creates and device != "cpu":
        with torch.device(device):
            return kernel(*args, **params)
    return kernel(*args, **params)


def chosen_kernel(opdef: OpDef, reproducible: bool, node: Any = None) -> registry.Kernel:
    """The op's kernel in this numerics mode (ravop/core/numerics_mode.py): its reproducible one where the mode is
    on, and a PlanError for an op that has none, never its default kernel in its place."""
    if not reproducible:
        return opdef.kernel
    if opdef.reproducible is None:
        raise PlanError(f"op {opdef.name!r} has no kernel in the reproducible numerics mode yet "
                        f"({numerics_mode.ENV}={numerics_mode.REPRODUCIBLE}; ravop/ops/reproducible.py lists the ops "
                        "it covers)", node)
    return opdef.reproducible


def _to(out: Any, device: str) -> Any:
    if isinstance(out, (tuple, list)):
        return type(out)(_to(o, device) for o in out)
    return out.to(device)


def on_device(opdef: OpDef, device: str, kernel: Optional[registry.Kernel] = None) -> registry.Kernel:
    """The callable that runs `opdef` (or its `kernel` variant) on `device` for an op that is not random: one
    that makes its tensors from params alone runs with the device as torch's default device."""
    kernel = opdef.kernel if kernel is None else kernel
    if not opdef.creates or device == "cpu":
        return kernel

    def create(*args: Any, **params: Any) -> Any:
        with torch.device(device):
            return kernel(*args, **params)
    return create


class PerRun:
    """What an op of a loop step changes from run to run, or a random op's draw: its random stream
    (`stream`: its node id, `stride`), its step counter (the param, and its recorded value) and the stream its
    `seed_param` follows (source id, stride)."""
    __slots__ = ("opdef", "graph_seed", "device", "stream", "stride", "counter", "counted", "seed_from")

    def __init__(self, opdef: OpDef, graph_seed: int, device: str, stream: int, stride: Optional[int] = None,
                 counted: Optional[int] = None, seed_from: Optional[tuple[int, Optional[int]]] = None) -> None:
        self.opdef, self.graph_seed, self.device = opdef, graph_seed, device
        self.stream, self.stride = stream, stride
        self.counter, self.counted, self.seed_from = opdef.counter, counted, seed_from

    def __call__(self, kernel: registry.Kernel, args: list[Any], params: dict[str, Any], at: Optional[At]) -> Any:
        if at is not None:
            if self.counted is not None:
                params = {**params, str(self.counter): self.counted + at.trained}
            if self.seed_from is not None:
                source, stride = self.seed_from
                name = str(self.opdef.seed_param)
                recorded = params[name]
                if source == self.stream and recorded != op_seed(self.graph_seed, source):
                    seed = step_seed(recorded, at.trained)   # a shared stream, named by its seed (ravop.record.loop)
                else:   # another op's stream, or its own (a TorchScript forward seeding its own dropout)
                    seed = op_seed(self.graph_seed, stream_id(source, stride, at))
                params = {**params, name: seed}
        if self.opdef.random:   # drawn as run_op draws: the same numbers on any device
            return run_op(self.opdef, args, params, self.graph_seed, stream_id(self.stream, self.stride, at),
                          self.device, kernel)
        return kernel(*args, **params)


# One call: (kernel, argument slots, params, result slot, slots freed after it, PerRun or None).
Call = tuple[registry.Kernel, tuple[int, ...], dict[str, Any], int, tuple[int, ...], Optional[PerRun]]
# One entry of a plan (`Runner.run`): (call index, the call, (getter, slot, index) of projections folded into it).
PlanEntry = tuple[int, Call, tuple[tuple[Callable[[Any], Any], int, int], ...]]


class Runner:
    """`nodes` (in order) built into calls over slots: first one slot per id of `inputs` (the values a run is
    given), then one per node. Values are freed after their last reader (`freed`: slot -> index of that
    reader), except `outputs` and, unless `free_inputs`, the inputs (a loop step's outer values serve every
    run). Building it checks the nodes as a plan from the network needs: `PlanError` for an op that is no
    kernel, a value read before it is defined, or one defined twice. `per_run`: node id -> its PerRun
    where a loop step sets it; random ops not in it draw from their own id's stream. `watcher`: a worker's
    memory rules, or None."""

    def __init__(self, nodes: Sequence[Node], inputs: Iterable[int], outputs: Iterable[int], device: str = "cpu",
                 graph_seed: int = 0, watcher: Optional[Watcher] = None, free_inputs: bool = True,
                 per_run: Optional[Mapping[int, PerRun]] = None) -> None:
        device = str(device)
        self.nodes = list(nodes)
        self.slot: dict[int, int] = {}
        for i in inputs:
            if i in self.slot:
                raise PlanError(f"value {i} is given twice")
            self.slot[i] = len(self.slot)
        n_inputs = len(self.slot)
        slot, table, not_kernels = self.slot, registry.REGISTRY, registry.NOT_KERNELS
        bound: dict[str, tuple[OpDef, registry.Kernel]] = {}   # op -> (OpDef, its kernel on the device)
        reproducible = numerics_mode.reproducible()
        kernels, arguments, varying = [], [], []
        last_read: dict[int, int] = {}   # slot -> index of its last reader
        per_run = per_run or {}
        n = n_inputs
        for index, node in enumerate(self.nodes):
            op = node.op
            found = bound.get(op)
            if found is None:
                opdef = table.get(op)
                if opdef is None or op in not_kernels:
                    raise PlanError(f"unknown op {op!r}", node)
                chosen = chosen_kernel(opdef, reproducible, node)
                found = bound[op] = (opdef, chosen if opdef.random else on_device(opdef, device, chosen))
            opdef, kernel = found
            try:
                args = tuple(map(slot.__getitem__, node.inputs))   # map: no frame per op, as a comprehension has
            except KeyError:
                missing = [i for i in node.inputs if i not in slot]
                raise PlanError(f"op {op!r} (node {node.id}) reads values {missing}, which are neither inputs nor "
                                "computed before it", node) from None
            for a in args:
                last_read[a] = index
            varies = per_run.get(node.id)
            if varies is None and opdef.random:
                varies = PerRun(opdef, graph_seed, device, node.id)
            kernels.append(kernel)
            arguments.append(args)
            varying.append(varies)
            if node.id in slot:
                raise PlanError(f"value {node.id} is defined twice", node)
            slot[node.id] = n
            n += 1
        self.kept = kept = {slot[i] for i in outputs if i in slot}
        self.freed = {s: index for s, index in last_read.items() if s not in kept and (free_inputs or s >= n_inputs)}
        frees: dict[int, list[int]] = {}
        for s, index in self.freed.items():
            frees.setdefault(index, []).append(s)
        self.calls: list[Call] = [
            (kernel, args, node.params, n_inputs + index, tuple(frees.get(index, ())), varies)
            for index, (kernel, args, node, varies) in enumerate(zip(kernels, arguments, self.nodes, varying))]
        self.values: list[Any] = [None] * len(slot)
        self.overwrites: dict[int, tuple[int, ...]] = {}   # call index -> the slots its in-place kernel overwrites
        # called once before the first call that overwrites a value in place, where set: a loop whose checkpoint
        # reads its values beside it waits there for that read (worker/loops/loop_subgraph.py)
        self.before_overwrite: Optional[Callable[[], None]] = None
        self.n_inputs, self.device, self.graph_seed, self.watcher = n_inputs, device, graph_seed, watcher
        if watcher is not None and len(watcher.limits) != len(self.nodes):
            raise ValueError(f"a watcher of {len(watcher.limits)} ops for {len(self.nodes)} nodes")

    def _fenced(self, entries: Iterable[PlanEntry], first: int) -> Iterator[PlanEntry]:
        """`entries`, with `before_overwrite()` called before the first of index `first` or later (the calls
        that overwrite values are the step's last: its optimizer updates)."""
        for entry in entries:
            if entry[0] >= first and self.before_overwrite is not None:
                self.before_overwrite()
            yield entry

    def replace(self, index: int, kernel: registry.Kernel, overwritten: Sequence[int]) -> None:
        """Run op `index` with `kernel`, an in-place variant overwriting its arguments at positions `overwritten`
        (see `check_in_place`)."""
        _, args, *rest = self.calls[index]
        self.calls[index] = (kernel, args, *rest)   # type: ignore[assignment]
        self.overwrites[index] = tuple(args[p] for p in overwritten)

    def run(self, at: Optional[At] = None, plan: Optional[Iterable[PlanEntry]] = None) -> list[Any]:
        """Run every call over `self.values` (the inputs' slots filled by the caller); returns the values.
        `plan`: the calls to run instead, as (index, call, spread): `spread` holds (getter, slot, index) of
        projections of the call's tuple that run right after it (ravop.runtime.step_compiler folds them in)."""
        values = self.values
        read = values.__getitem__
        watcher = self.watcher
        limits = None if watcher is None else watcher.limits
        entries = zip(count(), self.calls, repeat(())) if plan is None else plan
        if self.before_overwrite is not None and self.overwrites:
            entries = self._fenced(entries, min(self.overwrites))
        index = 0
        try:
            for index, (kernel, args, params, out, frees, varies), spread in entries:
                if varies is None:
                    value = kernel(*map(read, args), **params)
                else:
                    value = varies(kernel, list(map(read, args)), params, at)
                values[out] = value
                if limits is not None and isinstance(value, Tensor) and value.nbytes > limits[index]:
                    self._check(index, value, at)
                for getter, slot, index in spread:   # `index` now names the projection: its limit, its errors
                    item = values[slot] = getter(value)
                    if limits is not None and isinstance(item, Tensor) and item.nbytes > limits[index]:
                        self._check(index, item, at)
                for s in frees:
                    values[s] = None
        except OpError:
            self.drop()
            raise
        except Exception as exc:  # the user's error (bad params, data): name their op and line
            error = OpError(self.nodes[index], describe(exc, self.nodes[index]), self._shapes(index), _step(at))
            self.drop()
            raise error from exc
        return values

    def _check(self, index: int, value: Tensor, at: Optional[At]) -> None:
        """Raise OpError if the watcher refuses op `index`'s output `value` (one above its byte limit)."""
        problem = self.watcher.problem(index, value)   # type: ignore[union-attr]
        if problem is not None:
            raise OpError(self.nodes[index], problem, self._shapes(index), _step(at), True)

    def _shapes(self, index: int) -> list[Optional[tuple[Shape, Any]]]:
        values = self.values
        return [(tuple(v.shape), v.dtype) if isinstance(v, Tensor) else None
                for v in (values[a] for a in self.calls[index][1])]

    def drop(self) -> None:
        """Let go of every value (after an error: the traceback keeps the runner, not what it made)."""
        self.values = [None] * len(self.values)


def check_in_place(calls: Sequence[Call], overwrites: Mapping[int, Sequence[int]], owned: Iterable[int],
                   kept: Iterable[int], nodes: Sequence[Any] = ()) -> None:
    """Refuse (`PlanError`) a call list whose in-place calls (`overwrites`: call index -> slots it overwrites)
    break the contract of the module docstring: each overwritten slot is `owned` (copied in by the caller), not
    `kept` (a result handed out), overwritten once by one call that reads it only where it overwrites it, and read
    by no later call. `nodes` name the ops in the message."""
    owned, kept = set(owned), set(kept)
    overwriter: dict[int, int] = {}
    for index, slots in overwrites.items():
        where = f"op {nodes[index].op!r} (node {nodes[index].id})" if index < len(nodes) else f"call {index}"
        for s in slots:
            if s in overwriter:
                raise PlanError(f"{where} overwrites value slot {s} in place, which call {overwriter[s]} overwrites "
                                "too")
            overwriter[s] = index
            if s not in owned:
                raise PlanError(f"{where} overwrites value slot {s} in place, which its caller did not copy in")
            if s in kept:
                raise PlanError(f"{where} overwrites value slot {s} in place, which is a result handed out")
        args = calls[index][1]
        for s in set(slots):
            if args.count(s) != list(slots).count(s):
                raise PlanError(f"{where} overwrites value slot {s} in place and reads it at another argument too")
    for index, (_, args, *_) in enumerate(calls):
        for a in args:
            first = overwriter.get(a)
            if first is not None and index > first:
                name = f"op {nodes[index].op!r} (node {nodes[index].id})" if index < len(nodes) else f"call {index}"
                raise PlanError(f"{name} reads value slot {a} after call {first} overwrote it in place")


def _step(at: Optional[At]) -> Optional[int]:
    return None if at is None else at.step_index


def run_nodes(nodes: Sequence[Node], env: dict[int, Any], graph_seed: int = 0, device: str = "cpu",
              outputs: Optional[Iterable[int]] = None, watcher: Optional[Watcher] = None) -> dict[int, Any]:
    """Run `nodes` in order on `device` with a one-off `Runner`; `env` maps node id -> value and must hold every
    input from outside (on `device`). Adds `outputs` (default: every node's value) to `env` and returns it."""
    ids = [node.id for node in nodes]
    keep = ids if outputs is None else list(outputs)
    runner = Runner(nodes, list(env), keep, device, graph_seed, watcher)
    for i, s in zip(env, range(runner.n_inputs)):
        runner.values[s] = env[i]
    values = runner.run()
    slot = runner.slot
    env.update((i, values[slot[i]]) for i in keep)
    return env
