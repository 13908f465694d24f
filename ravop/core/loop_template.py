"""A training loop as plain data: `StepTemplate`s (a step's ops as `Node`s, with holes) and the `LoopSpec` that
runs them, with the loop's schedule (`LoopSpec.positions`: which template runs at each step) and how its data is
cut into batches (`batch_steps`, `round_orders`), each said here once. The requester records them
(`ravop.record.loop`), the compiler folds them from unrolled steps (compiler/passes/loops.py), prices them like any
subgraph (`compiler.cost`) and the plan writer packs them to protobuf once (`ravop.wire.loop_message`); a worker
unpacks them once and runs them (`ravop.runtime.loop_run`). A template is its ops plus short records, one per hole,
result or op with a per-run fact (`CarriedSlot`, `RowHole`, `RunHole`, `StepOutput`, `SeededOp`, `SeedFollower`,
`Received`, `Sent`); plan.proto's `LoopTemplate` keeps them as parallel lists, which only `ravop.wire.loop_message`
names.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .node import Node


@dataclass(frozen=True)
class CarriedSlot:
    """One value the loop carries from step to step: the id a step reads it as (`hole`) and the id of its value
    after the step (`after`)."""
    hole: int
    after: int


@dataclass(frozen=True)
class RowHole:
    """A hole filled with the step's batch rows of `data` (one of the loop's inputs, in `LoopSpec.outer_ids`)."""
    hole: int
    data: int


@dataclass(frozen=True)
class RunHole:
    """A hole filled at run r with the loop's input `values[r]` (a folded user loop's per-step R.t)."""
    hole: int
    values: tuple[int, ...]


@dataclass(frozen=True)
class StepOutput:
    """A value persisted at every run of the step, in the tensor store under `first_id` plus the run's index
    (`first_id`: given by the plan writer, compiler/plan.py; None before)."""
    node: int
    first_id: Optional[int] = None


@dataclass(frozen=True)
class SeededOp:
    """A random op that draws at run r from the stream of the recorded op id `node + r * stride` (the unrolled
    steps' own streams) instead of one derived from the run."""
    node: int
    stride: int


@dataclass(frozen=True)
class SeedFollower:
    """An op whose `seed` param is, at each run, the seed of op `source`'s stream at that run (dropout_backward
    redraws its forward's mask; a TorchScript forward seeds its own dropout from its id)."""
    node: int
    source: int


@dataclass(frozen=True)
class Received:
    """A hole filled at run r with the value sent on `channel` at that channel's run r (ravop.parallel's resident
    replicas and stages); `optional`: a round may close without it (DiLoCo's `close_after`), the step then reading
    zeros shaped as this hole node."""
    hole: int
    channel: str
    optional: Optional[Node] = None


@dataclass(frozen=True)
class Sent:
    """A value sent on `channel` at every run (the worker waits for what it receives, not for what it sends)."""
    node: int
    channel: str


@dataclass
class StepTemplate:
    """One step: its ops (`nodes`, in order), what it reads as holes and what it hands out, each as a short record
    (above); the wire's parallel lists are `ravop.wire.loop_message`'s alone. `counts`: a training step (it
    advances the step count and the batch in the round); `rows`: the rows of the batch each run slices;
    `counter_nodes`: ops whose step counter (`OpDef.counter`) is the recorded one plus the loop's count; `holes`:
    the hole nodes themselves (their shapes and dtypes, for the cost model), not packed, since a worker fills them
    with values."""
    nodes: list[Node]
    carried: list[CarriedSlot]
    counts: bool = True
    rows: int = 0
    row_holes: list[RowHole] = field(default_factory=list)
    run_holes: list[RunHole] = field(default_factory=list)
    counter_nodes: list[int] = field(default_factory=list)
    outputs: list[StepOutput] = field(default_factory=list)
    seeded: list[SeededOp] = field(default_factory=list)
    seed_followers: list[SeedFollower] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    holes: dict[int, Node] = field(default_factory=dict)

    def hole_ids(self) -> list[int]:
        return [*(c.hole for c in self.carried), *(r.hole for r in self.row_holes), *(r.hole for r in self.run_holes),
                *(r.hole for r in self.received)]

    def results(self) -> list[int]:
        """The ids the step hands out: its next carried values, persisted values and values sent."""
        return [*(c.after for c in self.carried), *(o.node for o in self.outputs), *(s.node for s in self.sent)]

    def outer_reads(self) -> list[int]:
        """The loop's inputs the step reads other than through its ops' inputs: rows' data and per-run values."""
        return [*(r.data for r in self.row_holes), *(i for r in self.run_holes for i in r.values)]


@dataclass
class LoopSpec:
    """`rounds` times the `schedule`'s (template index, times) pairs; the loop op's inputs are named
    `outer_ids` in the templates, its first `n_carried` the carried values' initial values. With `sync_every`,
    the `sync_templates` run in turn after every `sync_every` training steps and after the last one (a resident
    replica's exchange with the others, ravop.parallel); they are not in the schedule. Those in `before_first`
    also run once before the first step."""
    templates: list[StepTemplate]
    n_carried: int
    outer_ids: list[int]
    schedule: list[tuple[int, int]]
    rounds: int = 1
    n_steps: int = 0
    first_step: int = 0
    n_rows: int = 0
    batch_size: int = 0
    shuffle: bool = False
    shuffle_seed: int = 0
    sync_templates: list[int] = field(default_factory=list)
    sync_every: int = 0
    before_first: list[int] = field(default_factory=list)
    close_after_s: float = 0.0

    def row_counts(self) -> list[int]:
        """Per template: the rows of the batch each of its runs slices (0: it reads none)."""
        return [int(t.rows) if t.row_holes else 0 for t in self.templates]

    def total_steps(self) -> int:
        """How many steps `positions` lists for all the rounds: the scheduled ones, the syncs and those before the
        first step."""
        return self.rounds * sum(times for _, times in self.schedule) + self.n_syncs() * len(self.sync_templates) + \
            len(self.before_first)

    def positions(self) -> Iterator[tuple[int, int, int, int, int]]:
        """The loop's schedule, the one place it is spelled out: (template, round, first row, training steps
        before, run index of the template) of every step of the schedule's rounds up to the loop's last
        (`first_step + n_steps`), after the sync templates that run before the first step."""
        runs = [0] * len(self.templates)
        count, index, end = 0, 0, self.first_step + self.n_steps
        counts = [t.counts for t in self.templates]
        row_counts = self.row_counts()
        every = self.sync_every
        if not end:
            return  # no step at all, however many rounds a (hostile) plan declares
        for s in self.before_first:   # sync templates' run 0, before the first step
            if index == end:
                return
            yield s, 0, 0, 0, runs[s]
            runs[s] += 1
            index += 1
        r = 0
        for r in range(self.rounds):
            position = 0
            for t, times in self.schedule:
                for _ in range(times):
                    if index == end:
                        return
                    yield t, r, position, count, runs[t]
                    runs[t] += 1
                    position += row_counts[t]
                    count += counts[t]
                    index += 1
                    if every and counts[t] and count % every == 0:
                        for s in self.sync_templates:
                            if index == end:
                                return
                            yield s, r, position, count, runs[s]
                            runs[s] += 1
                            index += 1
        if every and count % every:   # the last round's sync, after a short last interval
            for s in self.sync_templates:
                if index == end:
                    return
                yield s, r, 0, count, runs[s]
                runs[s] += 1
                index += 1

    def segment_runs(self) -> list[int]:
        """How often each template runs in the steps [first_step, first_step + n_steps): counted from the
        schedule in O(len(schedule)) when the loop has no syncs (a loop of 10**9 steps records in O(1)), else
        listed (`positions`)."""
        if self.sync_templates:
            runs = [0] * len(self.templates)
            for index, (t, *_) in enumerate(self.positions()):
                runs[t] += index >= self.first_step
            return runs
        end = self.first_step + self.n_steps
        return [after - before for before, after in zip(self._runs_before(self.first_step), self._runs_before(end))]

    def _runs_before(self, step: int) -> list[int]:
        """How often each template runs in the first `step` steps of the rounds of a schedule without syncs."""
        rounds, rest = divmod(step, sum(times for _, times in self.schedule))
        runs = [0] * len(self.templates)
        for t, times in self.schedule:
            runs[t] += rounds * times + min(times, rest)
            rest -= min(times, rest)
        return runs

    def runs(self, template: int) -> int:
        """How often template `template` runs in all rounds of the schedule (a sync template: at every sync)."""
        if template in self.sync_templates:
            return self.n_syncs() + (template in self.before_first)
        return self.rounds * sum(times for t, times in self.schedule if t == template)

    def n_syncs(self) -> int:
        """How often the sync templates run: after every `sync_every` training steps and after the last."""
        if not self.sync_every:
            return 0
        trained = self.rounds * sum(times for t, times in self.schedule if self.templates[t].counts)
        return -(-trained // self.sync_every)


class LoopRecord:
    """What the graph keeps of a loop: its `LoopSpec` (without tensor ids for the persisted values) and, per
    template, the persist names of each of its outputs (one per run: a list, or a rule, `loss_names.RunNames`)."""
    __slots__ = ("spec", "names")

    def __init__(self, spec: LoopSpec, names: Sequence[Sequence[Sequence[str]]]) -> None:
        self.spec, self.names = spec, names


# How a loop's data is cut into batches, said once for the recorders (`fit`, its strategies' replicas and stages)
# and the runner: `n_rows` rows in batches of `batch_size` (the last one may be short), each round in order or in
# numpy's `default_rng(seed).permutation(n_rows)` order, one permutation per round drawn from one generator (as
# `ravdl.v2.utils.batch_iterator` does).
def batch_steps(n_rows: int, batch_size: int) -> list[tuple[int, int]]:
    """(rows, times) of one round's batches: `times` full batches of `batch_size` rows, then a short last one; a
    step template each, since the rows a step slices are part of its shapes."""
    n_full, short = divmod(n_rows, batch_size)
    return [(batch_size, n_full)] * bool(n_full) + [(short, 1)] * bool(short)


def round_orders(n_rows: int, shuffle: bool, seed: Any) -> Iterator[Optional[np.ndarray]]:
    """Each round's order of the rows, endlessly: None (in order), or with `shuffle` the next permutation drawn
    from `default_rng(seed)` (`seed`: an int, or a numpy Generator to continue)."""
    rng = np.random.default_rng(seed) if shuffle else None
    while True:
        yield None if rng is None else rng.permutation(n_rows)


def hole_node(node_id: int, like: Node, hole_op: str) -> Node:
    """A hole standing for a value shaped like `like` (for the cost model)."""
    return Node(node_id, hole_op, (), {}, b"", like.shape, like.dtype, like.source)

