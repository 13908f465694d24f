"""For benchmarks only (benchmarks/wan): a worker's device clock. `ravop-worker --emulate-device-flops F` makes the
worker behave as a device of F FLOP/s: each unit of work (a loop step, or a whole plain subgraph) is still
computed for real, then the worker sleeps until FLOPs / F seconds have passed since the unit began, so N
emulated providers can share 2 cores and still each look like a device of their own. `--benchmark-busy-file
PATH` writes the seconds this worker spent computing (emulated or real) to PATH as JSON after each unit, for the
harness to compute utilization (compute time over wall time); the rest of a worker's time is spent on the
network (fetching inputs, writing outputs and checkpoints, waiting for work). The file also says when the first
unit began and the last one ended (wall clock), and how long loop steps waited on a resident replica's exchange
(`exchange_s`) and on the loop's writes (`writes_s`: flushed losses, checkpoints), which is where a provider's
time goes (the harness's profile).

The device's timeline is kept apart from the host's: on a loaded host a sleep wakes late, and this clock's own
file write takes time after each unit, which a real device would not lose. That lag (`overslept_s`) is made up
from the next units' slack (the time they sleep out, `absorbed_s`), so the emulated device computes at its
FLOP/s whatever the host's scheduling; a receive from the exchange clears it (the device, ahead of the host,
would have waited for the same value: no credit is carried across a wait).

FLOPs are the registry's per-op estimates (`OpDef.flops`, else the largest tensor the op touches: the rules the
compiler's cost model uses), over the shapes the unit actually reads: its inputs' real shapes and its ops'
declared ones. A step's FLOPs are counted once per template.

Without either flag nothing here runs: the worker installs `Pacing`'s hooks only when one is given (`pacing`), so
a plain subgraph and a loop step run with no check for it."""
import json
import os
import time
from typing import Any, Callable, Optional, cast

from ravop.core import registry
from ravop.core.loop_template import LoopSpec, StepTemplate
from ravop.core.node import Node
from ravop.core.sizes import numel_estimate
from ravop.wire import unpack_nodes

class DeviceClock:
    """Paces units of work to `flops_per_s` (None: real compute, only timed) and keeps the totals."""

    def __init__(self, flops_per_s: Optional[float] = None, busy_file: Optional[str] = None) -> None:
        if flops_per_s is not None and not flops_per_s > 0:
            raise ValueError(f"--emulate-device-flops must be > 0, not {flops_per_s!r}")
        self.flops_per_s, self.busy_file = flops_per_s, busy_file
        self.busy = self.real = self.flops = 0.0   # seconds the device computed, of them really; FLOPs
        self.units = 0
        self.first: Optional[float] = None   # wall clock: the first unit's start, the last one's end
        self.last: Optional[float] = None
        self.waits = {"exchange_s": 0.0, "writes_s": 0.0, "overslept_s": 0.0, "absorbed_s": 0.0}
        self.lag = 0.0   # how far the host runs behind the device's timeline (see the module docstring)
        if busy_file and os.path.exists(busy_file):   # a provider restarted under the same file goes on counting
            with open(busy_file) as f:
                before = json.load(f)
            self.busy, self.real, self.flops, self.units = (before[k] for k in ("busy_s", "real_s", "flops", "units"))
            self.first = before.get("first")
            self.waits = {k: before.get(k, 0.0) for k in self.waits}

    def account(self, started: float, flops: float) -> None:
        """A unit of `flops` that began at `started` (time.monotonic) has just been computed: sleep out the rest
        of its emulated time, if any, and count it."""
        now = time.monotonic()
        real = now - started
        if self.first is None:
            self.first = time.time() - real
        busy = real
        if self.flops_per_s is not None:
            target = flops / self.flops_per_s
            if target > real:   # the device, `lag` ahead of the host, ends the unit `target` after it began
                busy = target
                absorbed = min(self.lag, target - real)
                self.waits["absorbed_s"] += absorbed
                self.lag -= absorbed
                left = target - real - absorbed
                if left > 0:
                    time.sleep(left)
                    self._lost(time.monotonic() - now - left)   # a loaded host wakes late
        self.busy += busy
        self.real += real
        self.flops += flops
        self.units += 1
        self.last = time.time()
        if self.busy_file:
            began = time.monotonic()
            self._write()
            self._lost(time.monotonic() - began)

    def _lost(self, seconds: float) -> None:
        self.lag += seconds
        self.waits["overslept_s"] += seconds

    def waited(self, kind: str, seconds: float, received: bool = False) -> None:
        """A loop step waited `seconds` on its exchange or its writes (`kind`: "exchange_s" or "writes_s"); counted
        at the next unit's write. `received`: a receive from the exchange, which clears the host's lag."""
        self.waits[kind] += seconds
        if received:
            self.caught_up()

    def caught_up(self) -> None:
        """The host waited for something outside the device (a value, work): its lag is gone."""
        self.lag = 0.0

    def _write(self) -> None:
        temporary = f"{self.busy_file}.{os.getpid()}"
        with open(temporary, "w") as f:
            json.dump({"busy_s": self.busy, "real_s": self.real, "flops": self.flops, "units": self.units,
                       "first": self.first, "last": self.last, **self.waits,
                       "emulated_flops_per_s": self.flops_per_s, "pid": os.getpid()}, f)
        os.replace(temporary, cast(str, self.busy_file))   # the harness never reads half a file


def pacing(flops_per_s: Optional[float] = None, busy_file: Optional[str] = None) -> Optional["Pacing"]:
    """The worker's pacing hooks (worker/serve/worker_cli.py) when either benchmark flag was given, else None."""
    if flops_per_s is not None or busy_file:
        return Pacing(DeviceClock(flops_per_s, busy_file))
    return None


def op_flops(op: str, shape: tuple[int, ...], input_shapes: list[tuple[int, ...]], params: dict[str, Any]) -> float:
    """The registry's FLOP estimate of one op (as compiler/cost.py's node_flops, on known shapes)."""
    opdef = registry.REGISTRY[op]
    if opdef.free:
        return 0.0
    if opdef.flops is not None:
        flops = opdef.flops(shape, input_shapes, params)
        if flops is not None:
            return float(flops)
    return float(max([numel_estimate(shape), *map(numel_estimate, input_shapes)]))


def nodes_flops(nodes: list[Node], shapes: dict[int, tuple[int, ...]]) -> float:
    """FLOPs of unpacked `nodes` in order; `shapes` maps the ids they read from outside to real shapes (it is
    extended with their declared ones)."""
    total = 0.0
    for node in nodes:
        shape = tuple(node.shape or ())
        shapes[node.id] = shape
        total += op_flops(node.op, shape, [shapes.get(i, ()) for i in node.inputs], node.params)
    return total


class Pacing:
    """The hooks a worker installs for the benchmark flags: each plain subgraph and each loop step paced as one unit
    of work on `clock`."""

    def __init__(self, clock: DeviceClock) -> None:
        self.clock = clock

    def run_subgraph(self, run: Callable[..., Any]) -> Callable[..., Any]:
        """`run` (worker/serve/consumer.py's plain subgraph hook: (subgraph, program, inputs, seed) -> outputs)
        paced as one unit; `inputs`: its input tensors by id."""
        clock = self.clock

        def paced(subgraph: Any, program: Any, inputs: dict[int, Any], seed: int) -> Any:
            clock.caught_up()   # the worker waited for this work
            started = time.monotonic()
            outputs = run(subgraph, program, inputs, seed)
            clock.account(started, nodes_flops(unpack_nodes(subgraph.nodes),
                                               {i: tuple(t.shape) for i, t in inputs.items()}))
            return outputs
        return paced

    def steps(self, on_step: Callable[..., None], loop: LoopSpec, loop_inputs: list[Any],
              exchange: Optional[Any] = None) -> tuple[Callable[..., None], Optional[Any]]:
        """(on_step, exchange) for `ravop.runtime.loop_run.LoopRun.run` (worker/loops/loop_subgraph.py's
        `LoopContext.pace_steps`), with each loop step paced as one unit first; `loop`: the `LoopSpec`,
        `loop_inputs`: the loop op's input tensors (carried initial values, then the outer ones), `exchange`: the
        loop's exchange with other loops (resident replicas), or None. The time a step spends in the exchange is
        network time: it is taken out of the step's compute time."""
        paced = _PacedSteps(self.clock, on_step, loop, loop_inputs)
        return paced, (None if exchange is None else _TimedExchange(self.clock, exchange, paced))


class _PacedSteps:
    def __init__(self, clock: DeviceClock, on_step: Callable[..., None], loop: LoopSpec,
                 loop_inputs: list[Any]) -> None:
        self.clock, self.on_step, self.loop, self.loop_inputs = clock, on_step, loop, loop_inputs
        self.outer = {i: tuple(t.shape) for i, t in zip(loop.outer_ids, loop_inputs)}
        self.step_flops: dict[int, float] = {}
        clock.caught_up()   # the worker waited for this loop and its inputs
        self.started = time.monotonic()

    def __call__(self, done: int, template: int, run: int, outputs: Any, carried: Any) -> None:
        if template not in self.step_flops:
            self.step_flops[template] = _template_flops(self.loop.templates[template], self.loop_inputs, self.outer)
        self.clock.account(self.started, self.step_flops[template])
        began = time.monotonic()
        self.on_step(done, template, run, outputs, carried)
        self.started = time.monotonic()
        # what on_step wrote (losses, checkpoints) was network time, not compute
        self.clock.waited("writes_s", self.started - began)


class _TimedExchange:
    """An exchange whose sends and receives move the current step's start forward by the time they took."""

    def __init__(self, clock: DeviceClock, exchange: Any, paced: _PacedSteps) -> None:
        self.clock, self.exchange, self.paced = clock, exchange, paced

    def send(self, channels: Any, run: int, values: Any) -> None:
        began = time.monotonic()
        self.exchange.send(channels, run, values)
        self.paced.started += time.monotonic() - began
        self.clock.waited("exchange_s", time.monotonic() - began)

    def receive(self, channels: Any, run: int, optional: Any = (), close_after: float = 0.0) -> Any:
        began = time.monotonic()
        try:
            return self.exchange.receive(channels, run, optional, close_after)
        finally:
            self.paced.started += time.monotonic() - began
            self.clock.waited("exchange_s", time.monotonic() - began, received=True)   # the device waits for it too


def _template_flops(template: StepTemplate, loop_inputs: list[Any], outer: dict[int, tuple[int, ...]]) -> float:
    shapes = dict(outer)
    for k, carried in enumerate(template.carried):
        shapes[carried.hole] = tuple(loop_inputs[k].shape)
    for row_hole in template.row_holes:
        shapes[row_hole.hole] = (int(template.rows), *outer.get(row_hole.data, (0,))[1:])
    for run_hole in template.run_holes:   # shaped as its first run's value
        shapes[run_hole.hole] = outer.get(run_hole.values[0], ()) if run_hole.values else ()
    return nodes_flops(template.nodes, shapes)
