"""Training loops recorded as step templates plus a count (docs/users/training_loops.md).

    loop = Loop(initial_values, Batches(n_rows, batch_size, shuffle, seed))
    with loop.step() as step:                 # records one step template
        params = step.carried                 # Ops standing for the carried values at the step's start
        X_batch = step.rows(X, batch_size)    # the step's batch: rows of X, an Op uploaded once
        ...                                   # the step, recorded as usual, reading those Ops
        step.carry(new_values)                # the carried values after the step
        step.persist(loss, names)             # `loss` persisted as names[k] at the step's k-th run
        step.stop_if(flag, names, reason)     # (optional) the loop ends at its next boundary after a true flag
    finals = loop.run([(0, times)], rounds)   # the loop op; its outputs are the carried values at the end

A step's ops are recorded into the graph like any others, between two marks; the compiler takes them out of
the op table and ships them once, as a template a worker runs N times (`ravop.runtime.loop_run`), keeping the
carried values in memory. So recording, compiling and uploading cost the same for 1 epoch or 100.

What a step may read: its holes (`carried`, `rows`), ops recorded before the loop (constants, the data, a
validation set: uploaded once, read by every step) and its own ops. Constants it records are hoisted out of
it (they are the same at every run). A value recorded inside a step exists once per run, so nothing recorded
after the loop may read it: the compiler says so with the reader's source line.

Ops that declare a step `counter` (optimizer steps, `step_row`) count training steps as torch does: at the k-th
training step of the loop (steps recorded with `counts=True`) their counter is the recorded one plus k; in a step
that does not count (a sync template), the recorded one plus the training steps run before it, so there an
optimizer step belonging to the training step it follows is recorded one lower (0 for a fresh optimizer: accepted
only in such a step, `Step.counted_params`).
Random ops draw at each run from a seed of the graph seed, the op and the run's index, so a run is
reproducible, on any worker, from any checkpoint; an op that declares a `seed_param` holding another op's seed
(dropout's backward redraws the forward's mask) follows that op's seed from run to run. A seed given to
`Step.seed_by_step` names a stream shared by every template of the loop instead: at each run the ops holding it
draw `op_seed(seed, training steps run before it)` (`ravop.runtime.runner.step_seed`), so two sync templates after one
training step (a pipeline stage's forward and its recompute) draw the same masks.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Optional, Sequence

import torch

from ..core import registry
from ..core.errors import GraphStateError
from ..core.loop_template import (CarriedSlot, LoopRecord, LoopSpec, Received, RowHole, SeedFollower, Sent,
                                  StepOutput, StepTemplate, batch_steps)
from ..core.loss_names import RunNames
from ..core.node import Node, node_of
from ..core.registry import HOLE, INPUTS, LOOP, LOOP_INDEX, op_of_kind
from ..runtime.runner import op_seed
from ..wire import encode_params
from .graph import Op, current_graph
from .source import user_source


def counter_of(node: Any) -> Optional[int]:
    """The recorded step count of an op that declares a step `counter`, if it is an int; else None."""
    return _declared_int(node, "counter")


def seed_of(node: Any) -> Optional[int]:
    """The int seed an op that declares a `seed_param` holds; else None."""
    return _declared_int(node, "seed_param")


def _declared_int(node: Any, flag: str) -> Optional[int]:
    """The int value of the param that the op's OpDef names in `flag` ("counter", "seed_param"), or None."""
    opdef = registry.REGISTRY.get(node.op)
    param = None if opdef is None else getattr(opdef, flag)
    if param is None:
        return None
    value = (node.params or {}).get(param)
    return value if type(value) is int else None


class Batches:
    """How steps that read `rows` slice their data: `n_rows` rows in batches of `batch_size` (the last one
    may be short), every round in order, or with `shuffle` in numpy's `default_rng(seed).permutation(n_rows)`
    order, one permutation per round drawn from one generator (as `ravdl.v2.utils.batch_iterator` does)."""
    __slots__ = ("n_rows", "batch_size", "shuffle", "seed")

    def __init__(self, n_rows: int, batch_size: int, shuffle: bool = False, seed: int = 0) -> None:
        if n_rows < 1 or batch_size < 1:
            raise ValueError(f"need n_rows >= 1 and batch_size >= 1, not {n_rows} and {batch_size}")
        if shuffle and int(seed) < 0:
            raise ValueError(f"a shuffle seed must be >= 0, not {seed}")
        self.n_rows, self.batch_size, self.shuffle, self.seed = int(n_rows), int(batch_size), bool(shuffle), int(seed)


class Loop:
    def __init__(self, initial: Iterable[Op], batches: Optional[Batches] = None) -> None:
        graph = current_graph()
        graph.check_open()
        if graph.recording_step is not None:
            raise GraphStateError("a loop cannot start inside the step of another loop")
        self.initial = list(initial)
        for k, op in enumerate(self.initial):
            if not isinstance(op, Op) or op.graph is not graph or isinstance(op.dtype, tuple):
                raise GraphStateError(f"carried value {k} must be a single-output Op of the current graph, not "
                                      f"{op!r}")
        self.graph = graph
        self.batches = batches
        self.templates: list[StepTemplate] = []
        self.names: list[list[Sequence[str]]] = []   # per template: the names (a list or a rule) per output
        self.rows_per_step: list[int] = []
        self.before_first: list[bool] = []   # per template: a sync template that also runs before the first step
        self.outer: dict[int, Op] = {}   # id -> Op recorded before the loop that a step reads, in first-read order
        self.step_ids: set[int] = set()
        self.closed = False

    @contextmanager
    def step(self, counts: bool = True, before_first: bool = False) -> Iterator[Step]:
        """Record one step template (see the module docstring); `counts`: a training step, which advances the
        optimizer step count and, if it reads rows, the batch; `before_first`: a sync template (`run`'s `sync`)
        that also runs once before the first step, so that its run k + 1 follows the k-th sync (a value ready
        at a sync is sent there, for the others' next sync: DiLoCo's overlap, ravop.parallel.resident)."""
        if self.closed:
            raise GraphStateError("this loop has been run: record its steps before loop.run()")
        if self.graph.recording_step is not None:
            raise GraphStateError("loop steps cannot nest")
        step = Step(self, counts, before_first)
        self.graph.recording_step = step
        try:
            yield step
        finally:
            self.graph.recording_step = None
        step.finish()

    def run(self, schedule: Iterable[tuple[int, int]], rounds: int = 1,
            segment: Optional[tuple[int, int]] = None, sync: Sequence[int] = (), sync_every: int = 0,
            close_after_s: float = 0.0) -> Any:
        """Record the loop op: `rounds` times, each template of `schedule` ((template index, times) pairs) run
        that many times in turn; with `segment=(first, n)` only the steps [first, first + n) of those rounds
        (one replica's steps between two synchronisations, ravop.parallel). The templates `sync` (steps recorded
        with counts=False that read no rows, not in the schedule) run in turn after every `sync_every` training
        steps and after the last one: a resident replica's exchange with the others (`Step.send`,
        `Step.receive`); those recorded with `before_first` also once before the first step; an optional receive
        waits at most `close_after_s` seconds (> 0 when a step has one). Returns the Ops of the carried values
        after the last step."""
        if self.closed:
            raise GraphStateError("this loop has already been run")
        if not self.templates:
            raise GraphStateError("the loop has no step: record one with `with loop.step() as step:`")
        schedule = [(int(t), int(times)) for t, times in schedule]
        if rounds < 1 or any(not 0 <= t < len(self.templates) or times < 0 for t, times in schedule):
            raise ValueError(f"bad loop schedule {schedule} x {rounds} for {len(self.templates)} templates")
        self._check_batches(schedule)
        sync, sync_every = [int(t) for t in sync], int(sync_every)
        self._check_sync(schedule, sync, sync_every, segment)
        if any(r.optional is not None for t in self.templates for r in t.received) and not close_after_s > 0:
            raise ValueError(f"a step receives optional values: give close_after_s > 0, not {close_after_s!r}")
        before_first = [t for t in sync if self.before_first[t]]
        inputs = tuple(self.initial) + tuple(self.outer.values())
        spec = LoopSpec(list(self.templates), len(self.initial), [op.id for op in inputs], schedule, rounds,
                        sync_templates=sync, sync_every=sync_every, before_first=before_first,
                        close_after_s=float(close_after_s))
        total = spec.total_steps()
        first, n_steps = (0, total) if segment is None else (int(segment[0]), int(segment[1]))
        if first < 0 or n_steps < 1 or first + n_steps > total:
            raise ValueError(f"segment {segment} is not within the loop's {total} steps")
        spec.first_step, spec.n_steps = first, n_steps
        runs = spec.segment_runs()
        for t, (template, names) in enumerate(zip(self.templates, self.names)):
            for node, per_run in zip((o.node for o in template.outputs), names):
                if len(per_run) != runs[t]:
                    raise ValueError(f"step {t} runs {runs[t]} times but node {node} has {len(per_run)} persist "
                                     "names")
        graph = self.graph
        self.closed = True
        if self.batches is not None:
            spec.n_rows, spec.batch_size = self.batches.n_rows, self.batches.batch_size
            spec.shuffle, spec.shuffle_seed = self.batches.shuffle, self.batches.seed
        source = user_source()
        shapes = tuple(op.shape for op in self.initial)
        dtypes = tuple(op.dtype for op in self.initial)
        node = graph.add_node(op_of_kind(LOOP), inputs, {LOOP_INDEX: len(graph.loops)}, shapes, dtypes, source)
        graph.loops[node.id] = LoopRecord(spec, self.names)
        return graph.add_outputs(node, zip(shapes, dtypes), source)

    def _check_sync(self, schedule: list[tuple[int, int]], sync: list[int], every: int,
                    segment: Optional[tuple[int, int]]) -> None:
        flagged = [t for t, flag in enumerate(self.before_first) if flag and t not in sync]
        if flagged:
            raise ValueError(f"steps {flagged} were recorded with before_first=True but are not sync templates {sync}")
        if not sync and not every:
            return
        if not sync or every < 1 or segment is not None:
            raise ValueError(f"sync templates {sync} need sync_every >= 1 (not {every}) and a loop of all its steps")
        scheduled = {t for t, _ in schedule}
        for t in sync:
            if not 0 <= t < len(self.templates) or t in scheduled:
                raise ValueError(f"sync template {t} is not a recorded step outside the schedule {schedule}")
            if self.templates[t].counts or self.rows_per_step[t]:
                raise ValueError(f"sync template {t} must be recorded with counts=False and read no rows")

    def _check_batches(self, schedule: list[tuple[int, int]]) -> None:
        """Steps that read rows must cover the data once per round, in batches of batch_size (the last short)."""
        if not any(self.rows_per_step):
            return
        if self.batches is None:
            raise ValueError("a step reads rows but the loop was given no Batches")
        n, size = self.batches.n_rows, self.batches.batch_size
        # the round's batches as runs of [rows, times left] (`batch_steps`), matched run by run: O(len(schedule))
        left = [[rows, times] for rows, times in batch_steps(n, size)]
        read = 0
        for t, times in schedule:
            rows = self.rows_per_step[t]
            while rows and times:
                want = left[0][0] if left else 0
                if rows != want:
                    raise ValueError(f"step {t} reads {rows} rows where batch {read // size + 1} has {want} "
                                     f"({n} rows in batches of {size})")
                run = min(times, left[0][1])
                times, read, left[0][1] = times - run, read + run * rows, left[0][1] - run
                if not left[0][1]:
                    left.pop(0)
        if read != n:
            raise ValueError(f"one round of the loop reads {read} rows of {n}")


def seed_params(rows: Sequence[Node], graph_seed: int) -> list[tuple[int, int]]:
    """(node id, source id) of the rows whose `seed_param` holds the seed of another row's stream
    (`op_seed(graph_seed, source id)`): dropout_backward redraws its forward's mask, a TorchScript forward seeds
    its own dropout. In a loop they must follow that stream from run to run."""
    found: list[tuple[int, int]] = []
    streams: Optional[dict[int, int]] = None
    for row in rows:
        seed = seed_of(row)
        if seed is None:
            continue
        if streams is None:
            streams = {op_seed(graph_seed, other.id): other.id for other in rows}
        if seed in streams:
            found.append((row.id, streams[seed]))
    return found


class Step:
    """One step template being recorded (`Loop.step`)."""

    def __init__(self, loop: Loop, counts: bool, before_first: bool = False) -> None:
        self.loop, self.counts, self.before_first = loop, bool(counts), bool(before_first)
        graph = loop.graph
        self.start = len(graph.nodes)
        source = user_source()
        self.carried = tuple(graph.add_node(op_of_kind(HOLE), (), {"hole": k}, op.shape, op.dtype, source)
                             for k, op in enumerate(loop.initial))
        self.row_holes: list[tuple[Op, Op]] = []   # (hole Op, data Op)
        self.next: Optional[list[Op]] = None
        self.outputs: list[tuple[Op, Sequence[str]]] = []
        self.received: list[tuple[Op, str]] = []   # (hole Op, channel)
        self.optional: list[bool] = []              # per received value: whether a round may close without it
        self.sent: list[tuple[Op, str]] = []       # (value, channel)
        self.step_seeds: set[int] = set()          # seeds of shared streams (seed_by_step)

    def seed_by_step(self, seeds: Iterable[int]) -> None:
        """Make the ops of this step whose `seed_param` holds one of `seeds` draw, at each run, `step_seed(seed,
        training steps run before it)`: a stream named by the seed, shared by every template that records it (see
        the module docstring). In the plan such an op is listed as following its own stream with a seed that is not
        its own stream's (an op holding its own stream's seed, a TorchScript forward seeding its own dropout, keeps
        following that stream per run)."""
        self.step_seeds |= {int(seed) for seed in seeds}

    def counted_params(self, counter: str, params: dict[str, Any]) -> dict[str, Any]:
        """The params an op's shape rule checks for one recorded with step counter 0 in this step: a sync template
        (counts=False) runs after the training step it belongs to, so its counter is the recorded one plus the
        training steps run by then, at least 1: an optimizer step of the training step's own count is recorded
        one lower, 0 for a fresh optimizer (resident pipeline stages step in their `update` template). Elsewhere 0
        stays refused by the rule."""
        return {**params, counter: 1} if not self.counts else params

    def rows(self, data: Op, n_rows: int) -> Op:
        """An Op for this step's batch of `n_rows` rows of `data` (an Op recorded before the loop)."""
        graph = self.loop.graph
        if not isinstance(data, Op) or data.graph is not graph or data.id >= self.start or not data.shape:
            raise GraphStateError(f"rows are sliced from an Op of at least 1 dimension recorded before the loop, "
                                  f"not {data!r}")
        if self.row_holes and self.row_holes[0][0].shape[0] != n_rows:
            raise ValueError("every rows() of one step takes the same number of rows")
        hole = graph.add_node(op_of_kind(HOLE), (), {"hole": len(self.carried) + len(self.row_holes)},
                              (int(n_rows),) + tuple(data.shape[1:]), data.dtype, user_source())
        self.row_holes.append((hole, data))
        return hole

    def receive(self, channel: str, like: Op, optional: bool = False) -> Op:
        """An Op for the value another loop of the graph sends on `channel` at this step's run (shaped like
        `like`); the worker waits for it (a resident replica's exchange, ravop.parallel). `optional`: it waits at
        most the loop's `close_after_s` (`Loop.run`), then the step runs with zeros in its place (a sender
        late or gone: DiLoCo's `close_after`)."""
        graph = self.loop.graph
        hole = graph.add_node(op_of_kind(HOLE), (), {"hole": len(self.carried) + len(self.row_holes) +
                                                      len(self.received)},
                              tuple(like.shape), like.dtype, user_source())
        self.received.append((hole, str(channel)))
        self.optional.append(bool(optional))
        return hole

    def send(self, op: Op, channel: str) -> None:
        """Send `op` on `channel` at every run of this step, for another loop's `receive`."""
        if not isinstance(op, Op) or op.graph is not self.loop.graph or isinstance(op.dtype, tuple):
            raise GraphStateError(f"a loop step sends a single-output Op of its graph, not {op!r}")
        if any(channel == sent for _, sent in self.sent):
            raise ValueError(f"the step sends twice on channel {channel!r}")
        self.sent.append((op, str(channel)))

    def carry(self, values: Iterable[Op]) -> None:
        """The carried values after this step, in the order of the loop's initial values."""
        values = list(values)
        initial = self.loop.initial
        if len(values) != len(initial):
            raise ValueError(f"the step carries {len(values)} values, the loop {len(initial)}")
        for k, (value, first) in enumerate(zip(values, initial)):
            if not isinstance(value, Op) or value.graph is not self.loop.graph:
                raise GraphStateError(f"carried value {k} after the step is not an Op of the loop's graph")
            if tuple(value.shape) != tuple(first.shape) or value.dtype != first.dtype:
                raise ValueError(f"carried value {k} is {tuple(first.shape)} {first.dtype} before the step and "
                                 f"{tuple(value.shape)} {value.dtype} after it: a step must keep its shape")
        self.next = values

    def persist(self, op: Op, names: Iterable[str]) -> None:
        """Persist `op` at every run of this step, as names[k] at the k-th run (`names`: a list, or a rule,
        `ravop.core.loss_names.RunNames`, which keeps recording O(1) in the runs)."""
        names = names if isinstance(names, RunNames) else list(names)   # a rule stays one: O(1) in the runs
        graph = self.loop.graph
        graph.check_persist_names(names)
        if isinstance(op.dtype, tuple):
            raise ValueError(f"cannot persist multi-output op {op.op!r}; persist one of its outputs")
        graph.step_outputs.add(names, op)
        self.outputs.append((op, names))

    def stop_if(self, flag: Op, names: Iterable[str], reason: str) -> None:
        """End the loop at its next boundary (before the next round; `ravop.runtime.loop_run`) after a run where
        `flag` (a scalar) is true, as if it had been recorded with the rounds run so far; the decision is persisted
        as names[k] at the k-th run, and `reason` is written in the graph's record (`stopped`). Where the losses
        are computed, so a fast loop stops at once, not when a requester's poll sees them."""
        if tuple(flag.shape) not in ((), (1,)):
            raise ValueError(f"stop_if takes a scalar flag, not one of shape {tuple(flag.shape)}")
        decision = self.loop.graph.add_node(op_of_kind(registry.LOOP_STOP), (flag,), {"reason": str(reason)}, (),
                                            torch.bool, user_source())
        self.persist(decision, names)

    def finish(self) -> None:
        loop, graph = self.loop, self.loop.graph
        if self.next is None:
            raise GraphStateError("the step did not say what it carries: call step.carry(values)")
        holes = {op.id for op in self.carried} | {hole.id for hole, _ in (*self.row_holes, *self.received)}
        inside = set(holes)
        rows = []
        counters = []
        for node in graph.nodes[self.start:]:
            if node.op in INPUTS or node.op in registry.HOLES:
                continue   # constants are hoisted: the same at every run
            if node.op in registry.LOOPS:
                raise GraphStateError(f"a loop cannot run inside the step of another loop (at {node.source})")
            for i in node.inputs:
                if i.id in inside:
                    continue
                if i.op in INPUTS:   # hoisted: a loop input like the values recorded before it
                    loop.outer.setdefault(i.id, i)
                    continue
                if i.id >= self.start or i.id in loop.step_ids:
                    raise GraphStateError(f"op {node.op!r} at {node.source} reads a value recorded in another "
                                          "step of the loop; a step reads its holes and what came before the loop")
                loop.outer.setdefault(i.id, i)
            inside.add(node.id)
            if counter_of(node) is not None:
                counters.append(node.id)
            rows.append(_node_of(node))
        for value in self.next + [op for op, _ in (*self.outputs, *self.sent)]:
            if value.id not in inside:
                if value.op not in INPUTS and (value.id >= self.start or value.id in loop.step_ids):
                    raise GraphStateError("a carried or persisted value of the step was recorded in another step")
                loop.outer.setdefault(value.id, value)
        for _, data in self.row_holes:
            loop.outer.setdefault(data.id, data)
        n_rows = self.row_holes[0][0].shape[0] if self.row_holes else 0
        template = StepTemplate(rows, [CarriedSlot(op.id, after.id) for op, after in zip(self.carried, self.next)],
                                self.counts, n_rows, [RowHole(hole.id, data.id) for hole, data in self.row_holes],
                                counter_nodes=counters, outputs=[StepOutput(op.id) for op, _ in self.outputs],
                                received=[Received(hole.id, channel, _node_of(hole) if optional else None)
                                          for (hole, channel), optional in zip(self.received, self.optional)],
                                sent=[Sent(op.id, channel) for op, channel in self.sent],
                                holes={op.id: _node_of(op) for op in (*self.carried, *(h for h, _ in self.row_holes),
                                                                      *(h for h, _ in self.received))})
        template.seed_followers += [SeedFollower(node_id, source) for node_id, source in seed_params(rows, graph.seed)]
        for row in rows if self.step_seeds else ():
            if seed_of(row) in self.step_seeds and row.id not in {f.node for f in template.seed_followers}:
                # its own: the stream its recorded seed names
                template.seed_followers.append(SeedFollower(row.id, row.id))
        loop.step_ids |= inside
        graph.step_ids |= inside
        loop.templates.append(template)
        loop.names.append([names for _, names in self.outputs])
        loop.rows_per_step.append(n_rows)
        loop.before_first.append(self.before_first)


def _node_of(op: Op) -> Node:
    """The `Node` of a recorded `Op`, its params as wire JSON too: the plan packs a template's nodes."""
    return node_of(op, encode_params(op.params) if op.params else b"")
