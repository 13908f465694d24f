"""A training loop as plain data: `StepTemplate`s (a step's ops as `Node`s, with holes) and the `LoopSpec` that
runs them. The requester records them (`ravop.record.loop`), the compiler folds them from unrolled steps
(compiler/passes/loops.py), prices them like any subgraph (`compiler.cost`) and the plan writer packs them to
protobuf once (`ravop.wire.loop_message`); a worker unpacks them once and runs them (`ravop.runtime.loop_run`). The
fields mirror plan.proto's `LoopTemplate` and `Loop`, where each is described.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from .node import Node


@dataclass
class StepTemplate:
    """One step: its ops (`nodes`, in order) and the ids they read as holes. `holes`: the hole nodes themselves
    (their shapes and dtypes, for the cost model); they are not packed, since a worker fills them with values."""
    nodes: list[Node]
    carry_holes: list[int]
    carry_next: list[int]
    counts: bool = True
    rows: int = 0
    row_holes: list[int] = field(default_factory=list)
    row_data: list[int] = field(default_factory=list)
    counter_nodes: list[int] = field(default_factory=list)
    output_nodes: list[int] = field(default_factory=list)
    output_first_ids: list[int] = field(default_factory=list)
    run_holes: list[int] = field(default_factory=list)
    run_values: list[int] = field(default_factory=list)
    seeded_nodes: list[int] = field(default_factory=list)
    seed_strides: list[int] = field(default_factory=list)
    seed_param_nodes: list[int] = field(default_factory=list)
    seed_param_sources: list[int] = field(default_factory=list)
    recv_holes: list[int] = field(default_factory=list)
    recv_channels: list[str] = field(default_factory=list)
    send_nodes: list[int] = field(default_factory=list)
    send_channels: list[str] = field(default_factory=list)
    recv_optional: list[bool] = field(default_factory=list)
    optional_holes: list[Node] = field(default_factory=list)
    holes: dict[int, Node] = field(default_factory=dict)

    def hole_ids(self) -> list[int]:
        return [*self.carry_holes, *self.row_holes, *self.run_holes, *self.recv_holes]

    def results(self) -> list[int]:
        """The ids the step hands out: its next carried values, persisted values and values sent."""
        return [*self.carry_next, *self.output_nodes, *self.send_nodes]


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


def hole_node(node_id: int, like: Node, hole_op: str) -> Node:
    """A hole standing for a value shaped like `like` (for the cost model)."""
    return Node(node_id, hole_op, (), {}, b"", like.shape, like.dtype, like.source)

