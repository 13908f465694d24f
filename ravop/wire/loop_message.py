"""A loop's `LoopSpec` as plan.proto's `Loop` (a `plan_pb2.Loop`, typed Any: generated code), and back: the one
place the step templates' records (`ravop.core.loop_template`) meet the wire's parallel lists, which keep their
shape (the same bytes as before the records). Packed once, by the plan writer (compiler/plan.py); unpacked once, by
the worker that runs it. `unpack_loop` checks that the parallel lists pair up, since a plan comes from the network;
what the ids mean is checked when the loop is built (`ravop.runtime.loop_run`)."""
from __future__ import annotations

from typing import Any

from ..core.errors import PlanError
from ..core.loop_template import (CarriedSlot, LoopSpec, Received, RowHole, RunHole, SeededOp, SeedFollower, Sent,
                                  StepOutput, StepTemplate)
from .nodes import pack_nodes, unpack_nodes

# The wire's lists that name one thing per element of another: (list, its partner, what they are).
_PAIRS = (("carry_holes", "carry_next", "carried holes and their next values"),
          ("row_holes", "row_data", "row holes and their data"),
          ("seeded_nodes", "seed_strides", "seeded ops and their strides"),
          ("seed_param_nodes", "seed_param_sources", "seed params and their sources"),
          ("recv_holes", "recv_channels", "received values and their channels"),
          ("send_nodes", "send_channels", "sent values and their channels"))


def pack_loop(spec: LoopSpec, message: Any) -> None:
    """Fill `message` (a plan_pb2.Loop) from `spec`."""
    for template in spec.templates:
        _pack_template(template, message.templates.add(counts=template.counts, rows=template.rows))
    message.n_carried, message.rounds = spec.n_carried, spec.rounds
    message.outer_ids.extend(spec.outer_ids)
    for pair in spec.schedule:
        message.schedule.extend(pair)
    message.n_steps, message.first_step = spec.n_steps, spec.first_step
    message.n_rows, message.batch_size = spec.n_rows, spec.batch_size
    message.shuffle, message.shuffle_seed = spec.shuffle, spec.shuffle_seed
    message.sync_templates.extend(spec.sync_templates)
    message.sync_every = spec.sync_every
    message.before_first.extend(spec.before_first)
    message.close_after_s = spec.close_after_s


def _pack_template(template: StepTemplate, packed: Any) -> None:
    # Each list is extended only when it has elements: most templates use a few of them, and a plan writer packs
    # every loop of a long fit's segments (thousands).
    pack_nodes(template.nodes, packed.nodes)
    if template.carried:
        packed.carry_holes.extend([c.hole for c in template.carried])
        packed.carry_next.extend([c.after for c in template.carried])
    if template.row_holes:
        packed.row_holes.extend([r.hole for r in template.row_holes])
        packed.row_data.extend([r.data for r in template.row_holes])
    if template.counter_nodes:
        packed.counter_nodes.extend(template.counter_nodes)
    if template.outputs:
        packed.output_nodes.extend([o.node for o in template.outputs])
        first_ids = [o.first_id for o in template.outputs if o.first_id is not None]
        if first_ids and len(first_ids) != len(template.outputs):
            raise ValueError("a loop step's persisted values have tensor ids for some runs' values but not all")
        packed.output_first_ids.extend(first_ids)
    if template.run_holes:
        runs = {len(r.values) for r in template.run_holes}
        if len(runs) > 1:
            raise ValueError(f"a loop step's per-run values cover different numbers of runs: {sorted(runs)}")
        packed.run_holes.extend([r.hole for r in template.run_holes])
        # hole h at run r reads run_values[r * len(run_holes) + h]
        packed.run_values.extend([value for values in zip(*(r.values for r in template.run_holes)) for value in values])
    if template.seeded:
        packed.seeded_nodes.extend([s.node for s in template.seeded])
        packed.seed_strides.extend([s.stride for s in template.seeded])
    if template.seed_followers:
        packed.seed_param_nodes.extend([f.node for f in template.seed_followers])
        packed.seed_param_sources.extend([f.source for f in template.seed_followers])
    if template.received:
        packed.recv_holes.extend([r.hole for r in template.received])
        packed.recv_channels.extend([r.channel for r in template.received])
    if template.sent:
        packed.send_nodes.extend([s.node for s in template.sent])
        packed.send_channels.extend([s.channel for s in template.sent])
    optional = [r.optional for r in template.received if r.optional is not None]
    if optional:   # empty when none is: the plans of loops that receive nothing optional stay as they were
        packed.recv_optional.extend([r.optional is not None for r in template.received])
    pack_nodes(optional, packed.optional_holes)


def received_channels(message: Any) -> set[str]:
    """The channels the templates of a plan_pb2.Loop receive on, read without decoding their nodes."""
    return {channel for template in message.templates for channel in template.recv_channels}


def unpack_loop(message: Any) -> LoopSpec:
    """The `LoopSpec` of a plan_pb2.Loop, each template's nodes decoded (`unpack_nodes`); `PlanError` if its
    lists do not pair up."""
    pairs = list(message.schedule)
    if len(pairs) % 2:
        raise PlanError("a loop schedule is (template, times) pairs")
    templates = [_unpack_template(packed) for packed in message.templates]
    return LoopSpec(templates, message.n_carried, list(message.outer_ids), list(zip(pairs[::2], pairs[1::2])),
                    message.rounds, message.n_steps, message.first_step, message.n_rows, message.batch_size,
                    message.shuffle, message.shuffle_seed, list(message.sync_templates), message.sync_every,
                    list(message.before_first), message.close_after_s)


def _unpack_template(packed: Any) -> StepTemplate:
    for a, b, what in _PAIRS:
        if len(getattr(packed, a)) != len(getattr(packed, b)):
            raise PlanError(f"a loop step's {what} do not pair up")
    outputs, first_ids = list(packed.output_nodes), list(packed.output_first_ids)
    if first_ids and len(first_ids) != len(outputs):
        raise PlanError("a loop step's persisted values and their tensor ids do not pair up")
    holes, table = list(packed.run_holes), list(packed.run_values)
    if not holes and table:
        raise PlanError("a loop step lists values per run but no holes for them")
    if holes and len(table) % len(holes):
        raise PlanError(f"a loop step's {len(table)} values per run do not fill its {len(holes)} holes evenly")
    optional_nodes, flags = unpack_nodes(packed.optional_holes), list(packed.recv_optional)
    if flags and (len(flags) != len(packed.recv_holes) or sum(flags) != len(optional_nodes)):
        raise PlanError("a loop step's optional received values do not pair up with its received values and "
                        "their holes")
    optional_holes = iter(optional_nodes)
    return StepTemplate(
        unpack_nodes(packed.nodes), [CarriedSlot(h, a) for h, a in zip(packed.carry_holes, packed.carry_next)],
        packed.counts, packed.rows, [RowHole(h, d) for h, d in zip(packed.row_holes, packed.row_data)],
        [RunHole(hole, tuple(table[h::len(holes)])) for h, hole in enumerate(holes)], list(packed.counter_nodes),
        [StepOutput(node, first_ids[k] if first_ids else None) for k, node in enumerate(outputs)],
        [SeededOp(n, s) for n, s in zip(packed.seeded_nodes, packed.seed_strides)],
        [SeedFollower(n, s) for n, s in zip(packed.seed_param_nodes, packed.seed_param_sources)],
        [Received(h, c, next(optional_holes) if flags and flags[k] else None)
         for k, (h, c) in enumerate(zip(packed.recv_holes, packed.recv_channels))],
        [Sent(n, c) for n, c in zip(packed.send_nodes, packed.send_channels)])
