"""Run a loop (a `ravop.core.loop_template.LoopSpec`): each step template is built once into a `StepFunction`,
the one runner (`ravop.runtime.runner.Runner`) over the template's ops with its holes as inputs, so a run of the
step does no decoding, validation or dictionary lookup; `LoopRun` runs the schedule, slicing each step's batch
from the data on the device. Used by workers (with checkpoints and persisted values, worker/loops/loop_subgraph.py)
and by `ravop.runtime.evaluate`.

A template comes from the network: every op must be a registered kernel op, every value read defined before,
and every id the loop names must exist, or `PlanError` says which. An op that raises, or whose output the
watcher refuses, is an `OpError` naming the op and the loop step, as on any subgraph.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, Sequence, runtime_checkable

import functools
import threading

import torch

from ..core import numerics_mode, registry
from ..core.alignment import aligned
from . import step_compiler
from ..core.errors import PlanError
from ..core.loop_template import LoopSpec, StepTemplate, round_orders
from .runner import At, PerRun, Runner, Watcher, check_in_place, on_device


@runtime_checkable
class RowSource(Protocol):
    """Data a loop reads only by its steps' batches, in order, given in place of a tensor: a worker's rows that
    stream from the store (`ravop.store.row_stream`). No op reads it whole, so the runner never holds it."""

    def read_rows(self, rows: slice) -> torch.Tensor: ...


def _batch(data: Any, rows: Any) -> torch.Tensor:
    """The rows of a data tensor a step reads: a slice (aligned: see ravop.core.alignment) or index tensor."""
    return aligned(data[rows]) if type(rows) is slice else data.index_select(0, rows)


class StepFunction:
    """One template, bound to the loop's outer values."""

    def __init__(self, template: StepTemplate, outer: dict[int, Any], n_carried: int, graph_seed: int, device: str,
                 owned: set[int] | frozenset[int] = frozenset(), watcher: Optional[Watcher] = None,
                 decisions: Optional[step_compiler.Decisions] = None, runs: Optional[int] = None) -> None:
        """`watcher`: a worker's memory rules for the template's ops (`ravop.runtime.runner.Watcher`), or None;
        `decisions`: where the step compiler keeps which variant runs faster (None: the step runs op by op);
        `runs`: how often the loop runs this template (the step compiler measures only steps that run often)."""
        device = str(device)
        if len(template.carried) != n_carried:
            raise PlanError(f"a loop step names {len(template.carried)} carried values where the loop carries "
                            f"{n_carried}")
        for row_hole in template.row_holes:
            if row_hole.data not in outer:
                raise PlanError(f"a loop step slices rows of {row_hole.data}, which is not an input of the loop")
        held = {i: value for i, value in outer.items() if not isinstance(value, RowSource)}   # not read by rows only
        self.runner = Runner(template.nodes, [*held, *template.hole_ids()], template.results(), device, graph_seed,
                             watcher, free_inputs=False, per_run=self._per_run(template, graph_seed, device))
        slot, values = self.runner.slot, self.runner.values
        for node_id, value in held.items():
            values[slot[node_id]] = value
        self.carry_slots = [slot[c.hole] for c in template.carried]
        self.rows: list[tuple[int, Callable[[Any], torch.Tensor]]] = [
            (slot[r.hole], outer[r.data].read_rows if isinstance(outer[r.data], RowSource) else
             functools.partial(_batch, outer[r.data]))
            for r in template.row_holes]
        self.run_holes = self._run_holes(template, outer, slot)
        after = [c.after for c in template.carried]
        for i in [*after, *(o.node for o in template.outputs)]:
            if i not in slot:
                raise PlanError(f"a loop step names value {i} as a result but does not define it")
        self.next_slots = [slot[i] for i in after]
        # a value carried on in two slots (a resident replica restarts from the global model it keeps) is copied
        # into the later ones, so that an optimizer step updating one in place leaves the other alone
        self.copied = [k for k, i in enumerate(after) if i in after[:k]]
        self.output_slots = [slot[o.node] for o in template.outputs]
        for sent in template.sent:
            if sent.node not in slot:
                raise PlanError(f"a loop step sends value {sent.node} but does not define it")
        self.recv_slots = [slot[r.hole] for r in template.received]
        self.send_slots = [slot[s.node] for s in template.sent]
        self.recv_channels = [r.channel for r in template.received]
        self.send_channels = [s.channel for s in template.sent]
        # optional received values (a round that may close without them): their zeros' shapes and dtypes
        self.optional = [r.optional is not None for r in template.received] \
            if any(r.optional is not None for r in template.received) else []
        self.absent = [(tuple(r.optional.shape), r.optional.dtype) for r in template.received
                       if r.optional is not None]
        owned_slots = {self.carry_slots[k] for k in owned}
        self._update_in_place(owned_slots, device)
        check_in_place(self.runner.calls, self.runner.overwrites, owned_slots,
                       {*self.next_slots, *self.output_slots, *self.send_slots}, self.runner.nodes)
        self.tuned = step_compiler.tune(self.runner, template.nodes, [*outer, *template.hole_ids()], decisions,
                                        template.hole_ids(), template.results(), runs)
        self.run_step = self.runner.run if self.tuned is None else self.tuned.run

    def run_plain(self) -> None:
        """Run op by op from now on: hooks that wrap the runner's calls (tracing, tests) see every op."""
        if self.tuned is not None:
            self.tuned.plain()
        self.run_step = self.runner.run

    @staticmethod
    def _per_run(template: StepTemplate, graph_seed: int, device: str) -> dict[int, PerRun]:
        """What changes per run, by node: random streams, step counters (ops declaring a `counter`) and seed
        params following a stream (ops declaring a `seed_param`)."""
        strides = {s.node: s.stride for s in template.seeded}
        seed_params = {f.node: f.source for f in template.seed_followers}
        if len(strides) != len(template.seeded) or len(seed_params) != len(template.seed_followers):
            raise PlanError("a loop step seeds a value twice")
        ids = {node.id for node in template.nodes}
        unknown = sorted((set(strides) | set(seed_params) | set(seed_params.values())) - ids)
        if unknown:
            raise PlanError(f"a loop step seeds values {unknown[:5]}, which are not its ops")
        counted = set(template.counter_nodes)
        per_run = {}
        for node in template.nodes:
            opdef = registry.REGISTRY.get(node.op)
            if opdef is None:
                continue   # the Runner refuses it
            counter = seed_from = None
            if node.id in counted:
                counter = node.params.get(opdef.counter) if opdef.counter is not None else None
                if type(counter) is not int:
                    raise PlanError(f"op {node.op!r} counts steps but has no int step counter param", node)
            if node.id in seed_params:
                if opdef.seed_param is None or type(node.params.get(opdef.seed_param)) is not int:
                    raise PlanError(f"op {node.op!r} of a loop step is given a seed but has no int seed param", node)
                source = seed_params[node.id]
                seed_from = (source, strides.get(source))
            if opdef.random or counter is not None or seed_from is not None:
                per_run[node.id] = PerRun(opdef, graph_seed, device, node.id, strides.get(node.id), counter, seed_from)
        return per_run

    @staticmethod
    def _run_holes(template: StepTemplate, outer: dict[int, Any], slot: dict[int, int]) -> list[tuple[int, list]]:
        """[(slot, [value at run r])] of the values that differ per run (`run_holes`)."""
        if len({len(r.values) for r in template.run_holes}) > 1:
            raise PlanError("a loop step's values per run cover different numbers of runs")
        unknown = sorted({i for r in template.run_holes for i in r.values if i not in outer})
        if unknown:
            raise PlanError(f"a loop step reads values {unknown[:5]} per run, which are not inputs of the loop")
        return [(slot[r.hole], [outer[i] for i in r.values]) for r in template.run_holes]

    def runs(self) -> Optional[int]:
        """How many runs the step's per-run values cover (None: any number)."""
        return len(self.run_holes[0][1]) if self.run_holes else None

    def _update_in_place(self, owned: set[int], device: str) -> None:
        """Give the trailing ops that declare an in-place variant (optimizer steps) that kernel where every value
        they overwrite is an owned carried value (see `LoopRun`) that nothing reads after them and the step does
        not hand on."""
        if numerics_mode.reproducible():
            return   # the in-place variants are the default kernels' (torch's lerp_, addcmul_): copies instead
        runner = self.runner
        kept = set(self.next_slots) | set(self.output_slots) | set(self.send_slots)
        last_read = {}
        for index, (_, args, *_) in enumerate(runner.calls):
            for a in args:
                last_read[a] = index
        for index in range(len(runner.calls) - 1, -1, -1):
            op = runner.nodes[index].op
            if op in registry.PROJECTIONS:
                continue
            opdef = registry.REGISTRY[op]
            if opdef.in_place is None:
                return   # the block of optimizer steps at the end of the step is over
            args = runner.calls[index][1]
            targets = [args[p] for p in opdef.in_place.overwritten]
            if len(set(targets)) == len(targets) and all(
                    t in owned and t not in kept and last_read[t] == index for t in targets):
                runner.replace(index, on_device(opdef, device, opdef.in_place.kernel), opdef.in_place.overwritten)

    def __call__(self, carried: Sequence[Any], rows: Any, count: int, step_index: int,
                 run: int = 0, received: Sequence[Any] = ()) -> tuple[list[Any], list[Any]]:
        """(carried values after the step, persisted values) of one run; `rows`: the batch's row indices (a
        slice or an index tensor), `count`: training steps run before this one, `run`: the runs of this
        template before this one, `received`: the values of its `received` holes (what it sends is `sent()`)."""
        values = self.runner.values
        for s, value in zip(self.carry_slots, carried):
            values[s] = value
        for s, value in zip(self.recv_slots, received):
            values[s] = value
        for s, batch in self.rows:
            values[s] = batch(rows)
        for s, per_run in self.run_holes:
            values[s] = per_run[run]
        values = self.run_step(At(count, step_index, run))
        after = [values[s] for s in self.next_slots]
        for k in self.copied:
            after[k] = after[k].clone()
        return after, [values[s] for s in self.output_slots]

    def sent(self) -> list[Any]:
        """The values the last run sends (`sent`)."""
        return [self.runner.values[s] for s in self.send_slots]


class Exchange(Protocol):
    """How a loop's steps reach the other loops of its graph: values are sent on named channels, one per run of
    the sending step; receiving waits until the value of that run is there. Writes are idempotent (a replica
    resumed from its checkpoint sends the same bits again)."""

    def send(self, channels: Sequence[str], run: int, values: Sequence[Any]) -> None: ...

    def receive(self, channels: Sequence[str], run: int, optional: Sequence[bool] = (),
                close_after: float = 0.0) -> list[Any]:
        """The values of `channels` at `run`; with `optional` (a flag per channel), those flagged are waited for
        at most `close_after` seconds and None where the run went without them (the same at every replay)."""


def received_values(exchange: Exchange, step: Any, run: int, close_after: float, device: str) -> list[Any]:
    """What `step` (a StepFunction) receives at `run`: zeros in place of the optional values that did not come."""
    if not step.optional:
        return exchange.receive(step.recv_channels, run)
    if not close_after > 0:   # a plan from the network: a zero wait would go without every optional value
        raise PlanError(f"a loop step receives optional values but the loop's close_after_s is {close_after!r}")
    values = exchange.receive(step.recv_channels, run, step.optional, close_after)
    absent = iter(step.absent)
    out = []
    for value, optional in zip(values, step.optional):
        shape, dtype = next(absent) if optional else (None, None)
        out.append(torch.zeros(shape, dtype=dtype, device=device) if value is None else value)
    return out


class MemoryExchange:
    """An `Exchange` between loops run by threads of one process (`ravop.runtime.evaluate`). No loop of one
    process is lost, so it waits for optional values too: the bits of a round that went without nothing."""

    def __init__(self, timeout: float = 600.0) -> None:
        self.values: dict[tuple[str, int], Any] = {}
        self.changed = threading.Condition()
        self.timeout = timeout
        self.failed: Optional[BaseException] = None   # a loop's error: the others stop waiting for it

    def fail(self, error: BaseException) -> None:
        with self.changed:
            self.failed = error
            self.changed.notify_all()

    def send(self, channels: Sequence[str], run: int, values: Sequence[Any]) -> None:
        with self.changed:
            for channel, value in zip(channels, values):
                self.values.setdefault((channel, run), value.clone())
            self.changed.notify_all()

    def receive(self, channels: Sequence[str], run: int, optional: Sequence[bool] = (),
                close_after: float = 0.0) -> list[Any]:
        keys = [(channel, run) for channel in channels]
        with self.changed:
            if not self.changed.wait_for(lambda: self.failed or all(k in self.values for k in keys), self.timeout):
                missing = [k for k in keys if k not in self.values]
                raise PlanError(f"no loop of the graph sent {missing[:3]} within {self.timeout} s")
            if self.failed is not None:
                raise PlanError(f"a loop this one exchanges values with failed: {self.failed}")
            return [self.values[k] for k in keys]


class LoopRun:
    """A loop ready to run: `inputs` are the loop op's input values (carried initial values, then the outer
    values), on `device`."""

    def __init__(self, loop: LoopSpec, inputs: Sequence[Any], graph_seed: int, device: str = "cpu",
                 watch: Optional[Callable[[StepTemplate], Watcher]] = None,
                 decisions: Optional[step_compiler.Decisions] = step_compiler.IN_PROCESS,
                 donated: Iterable[int] = ()) -> None:
        """`watch(template)`: the memory watcher of a template's ops (see StepFunction), or None;
        `decisions`: the step compiler's (`ravop.runtime.step_compiler`; None: every step runs op by op);
        `donated`: positions of carried initial values the caller hands over (it reads them no more, nor does
        anything else: a worker's inputs that only start the loop): the run from the initial values updates
        them in place instead of copying them first (4 bytes a parameter less for each), and a second such run
        is refused."""
        if len(inputs) != len(loop.outer_ids) or loop.n_carried > len(inputs):
            raise PlanError(f"the loop op has {len(inputs)} inputs but its plan names {len(loop.outer_ids)} "
                            f"({loop.n_carried} carried)")
        self.loop = loop
        self.initial: Optional[list[Any]] = list(inputs[:loop.n_carried])
        outer = dict(zip(loop.outer_ids, inputs))
        self.owned = _owned(loop)
        # still copied: a value a step reads as an outer value too, or a tensor given at two positions (an update
        # in place would change what the other reads)
        read = {i for t in loop.templates for node in t.nodes for i in node.inputs} | \
            {i for t in loop.templates for i in (*t.outer_reads(), *(f.source for f in t.seed_followers))}
        self.donated = {k for k in donated if k in self.owned and loop.outer_ids[k] not in read and
                        sum(v is inputs[k] for v in inputs) == 1}
        self.steps = [StepFunction(t, outer, loop.n_carried, graph_seed, device, self.owned,
                                   None if watch is None else watch(t), decisions, loop.runs(k))
                      for k, t in enumerate(loop.templates)]
        self.schedule = list(loop.schedule)
        if any(t >= len(self.steps) for t, _ in self.schedule):
            raise PlanError("a loop schedule names a template the loop does not have")
        self.syncs = list(loop.sync_templates)
        scheduled = {t for t, _ in self.schedule}
        if bool(self.syncs) != bool(loop.sync_every) or any(
                t >= len(self.steps) or loop.templates[t].counts or loop.templates[t].row_holes or t in scheduled
                for t in self.syncs):
            raise PlanError("a loop's sync templates must be templates outside its schedule that neither count nor "
                            "read rows, and come with their interval")
        self.before_first = list(loop.before_first)
        if len(set(self.before_first)) != len(self.before_first) or not set(self.before_first) <= set(self.syncs):
            raise PlanError("the templates a loop runs before its first step must be distinct sync templates")
        self.row_counts = loop.row_counts()
        if loop.shuffle and any(isinstance(value, RowSource) for value in outer.values()):
            raise PlanError("a shuffled loop reads rows from anywhere in its data in every batch: its data cannot "
                            "stream (read it whole)")
        total = loop.total_steps()
        if loop.first_step + loop.n_steps > total:
            raise PlanError(f"the loop declares steps {loop.first_step}..{loop.first_step + loop.n_steps} but its "
                            f"schedule runs {total}")
        if any(self.row_counts) and (loop.batch_size < 1 or loop.n_rows < 1):
            raise PlanError("a loop step slices rows but the loop has no batches")
        for t, step in enumerate(self.steps):
            n = loop.runs(t)
            if step.runs() not in (None, n):
                raise PlanError(f"loop step {t} runs {n} times but has values for {step.runs()} runs")
        # per template: (position among its persisted values, reason) of its decisions to end the loop
        self.decisions = [[(k, node.params["reason"]) for k, node in enumerate(map({n.id: n for n in t.nodes}.get,
                                                                                     (o.node for o in t.outputs)))
                           if node is not None and node.op in registry.LOOP_STOPS] for t in loop.templates]
        if any(self.decisions) and not self.stoppable():
            raise PlanError("a loop that ends itself (a step's stop_if) must be whole and exchange nothing")
        self.stop_reason: Optional[str] = None   # the reason of the decision that ended the loop, if one did
        self.device = device

    def fence(self, wait: Callable[[], None]) -> None:
        """Call `wait()` once, before the next run's first update of a carried value in place (its optimizer
        steps): a checkpoint reading the carried values beside the loop holds them unchanged until then, while the
        step's forward and backward run (worker/loops/loop_subgraph.py)."""
        runners = [step.runner for step in self.steps]

        def once() -> None:
            for runner in runners:
                runner.before_overwrite = None
            wait()
        for runner in runners:
            runner.before_overwrite = once

    def exchanges(self) -> bool:
        """Whether a step sends or receives values (then the loop runs only where an `Exchange` is given)."""
        return any(step.recv_slots or step.send_slots for step in self.steps)

    def stoppable(self) -> bool:
        """Whether the loop can end early at a boundary and equal the same loop recorded shorter: a whole loop
        (not one segment of a replica's) that exchanges nothing with other loops, which would wait for it."""
        return not (self.exchanges() or self.syncs or self.loop.first_step)

    def run(self, carried: Optional[Sequence[Any]] = None, start: int = 0,
            on_step: Optional[Callable[[int, int, int, list[Any], list[Any]], None]] = None,
            exchange: Optional[Exchange] = None, stop: Optional[Callable[[], bool]] = None) -> list[Any]:
        """Run the loop's steps from its `start`-th with `carried` (the initial values by default); after each
        step `on_step(steps done, template, run index, persisted values, carried values)`, counted from the
        loop's first step (a segment's `first_step`). `exchange`: how steps that send or receive values reach the
        other loops (`Exchange`). `stop()`, asked at each boundary (before a round, an epoch, of a loop of
        several; before each step of a loop of one round), ends the loop there if true, as does a true decision
        of a step's own (`ravop.record.loop.Step.stop_if`, its reason then in `stop_reason`): it returns the carried
        values of that point, which the loop recorded with that many rounds (or steps) gives, and `stopped_at`
        says where, as (steps run, rounds run, training steps run). Returns the carried values after the last
        step."""
        if exchange is None and self.exchanges():
            raise PlanError("this loop exchanges values with other loops of its graph (resident replicas): it runs "
                            "on workers, whose loops reach each other through the store, not in one process")
        copied = self.owned
        if carried is None:
            if self.initial is None:
                raise PlanError("this loop's donated initial values were updated in place by its first run: "
                                "another run needs the initial values again (LoopRun without `donated`)")
            carried, copied = self.initial, self.owned - self.donated
            if self.donated:
                self.initial = None
        carried = list(carried)
        for k in copied:   # the loop updates these in place: never the caller's tensors
            carried[k] = carried[k].clone()
        loop = self.loop
        orders = round_orders(int(loop.n_rows), loop.shuffle, loop.shuffle_seed)
        order, order_round = None, -1
        first = loop.first_step
        first_runs = [0] * len(self.steps)   # each template's runs before the segment
        self.stopped_at = self.stop_reason = None
        every_step, last_round = loop.rounds == 1, -1
        if stop is not None and not self.stoppable():
            raise PlanError("this loop cannot stop early: it is a segment of a replica's, or exchanges values")
        with torch.no_grad():
            for index, (t, r, position, count, run) in enumerate(loop.positions()):
                boundary, last_round = every_step or r != last_round, r
                if boundary and index >= first + start and (self.stop_reason is not None or
                                                            (stop is not None and stop())):
                    self.stopped_at = (index - first, r, count)
                    break
                if loop.shuffle and r != order_round:
                    permutation = next(orders)   # drawn for skipped rounds too
                    order_round = r
                    order = None
                if index < first:
                    first_runs[t] += 1
                if index < first + start:
                    continue
                n = self.row_counts[t]
                rows = None
                if n:
                    if not loop.shuffle:
                        rows = slice(position, position + n)
                    else:
                        if order is None:
                            order = torch.from_numpy(permutation).to(self.device)
                        rows = order[position:position + n]
                step = self.steps[t]
                received = received_values(exchange, step, run, self.loop.close_after_s, self.device) \
                    if step.recv_slots and exchange is not None else ()
                carried, outputs = step(carried, rows, count, index, run, received)
                if step.send_slots and exchange is not None:
                    exchange.send(step.send_channels, run, step.sent())
                for k, reason in self.decisions[t]:
                    if self.stop_reason is None and bool(outputs[k]):
                        self.stop_reason = reason   # taken at the next boundary, where the loop's rounds end
                if on_step is not None:
                    on_step(index + 1 - first, t, run - first_runs[t], outputs, carried)
        return carried


def _owned(loop: LoopSpec) -> set[int]:
    """The carried values the loop owns: in every template, the step makes its next value with an op (or
    passes it through), and never persists it. From the second step on they are tensors no one else holds, so
    optimizer steps may update them in place; the initial values are copied once."""
    owned = set(range(loop.n_carried))
    for template in loop.templates:
        made = {node.id for node in template.nodes}
        persisted = {o.node for o in template.outputs}
        for k, (hole, after) in enumerate((c.hole, c.after) for c in template.carried):
            if (after not in made and after != hole) or after in persisted or hole in persisted:
                owned.discard(k)
    return owned

