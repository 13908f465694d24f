"""A loop's `LoopSpec` as plan.proto's `Loop` (a `plan_pb2.Loop`, typed Any: generated code), and back. Packed
once, by the plan writer (compiler/plan.py); unpacked once, by the worker that runs it. `unpack_loop` checks that the parallel lists pair up, since a plan
comes from the network; what the ids mean is checked when the loop is built (`ravop.runtime.loop_run`)."""
from __future__ import annotations

from typing import Any

from ..core.errors import PlanError
from ..core.loop_template import LoopSpec, StepTemplate
from .nodes import pack_nodes, unpack_nodes

_LISTS = ("carry_holes", "carry_next", "row_holes", "row_data", "counter_nodes", "output_nodes", "output_first_ids",
          "run_holes", "run_values", "seeded_nodes", "seed_strides", "seed_param_nodes", "seed_param_sources",
          "recv_holes", "recv_channels", "send_nodes", "send_channels", "recv_optional")
# Lists that name one thing per element of another: (list, its partner, what they are).
_PAIRS = (("row_holes", "row_data", "row holes and their data"),
          ("seeded_nodes", "seed_strides", "seeded ops and their strides"),
          ("seed_param_nodes", "seed_param_sources", "seed params and their sources"),
          ("recv_holes", "recv_channels", "received values and their channels"),
          ("send_nodes", "send_channels", "sent values and their channels"))


def pack_loop(spec: LoopSpec, message: Any) -> None:
    """Fill `message` (a plan_pb2.Loop) from `spec`."""
    for template in spec.templates:
        packed = message.templates.add(counts=template.counts, rows=template.rows)
        pack_nodes(template.nodes, packed.nodes)
        for name in _LISTS:
            getattr(packed, name).extend(getattr(template, name))
        pack_nodes(template.optional_holes, packed.optional_holes)
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


def unpack_loop(message: Any) -> LoopSpec:
    """The `LoopSpec` of a plan_pb2.Loop, each template's nodes decoded (`unpack_nodes`); `PlanError` if its
    lists do not pair up."""
    pairs = list(message.schedule)
    if len(pairs) % 2:
        raise PlanError("a loop schedule is (template, times) pairs")
    templates = []
    for packed in message.templates:
        lists = {name: list(getattr(packed, name)) for name in _LISTS}
        for a, b, what in _PAIRS:
            if len(lists[a]) != len(lists[b]):
                raise PlanError(f"a loop step's {what} do not pair up")
        optional_holes = unpack_nodes(packed.optional_holes)
        if lists["recv_optional"] and (len(lists["recv_optional"]) != len(lists["recv_holes"]) or
                                       sum(lists["recv_optional"]) != len(optional_holes)):
            raise PlanError("a loop step's optional received values do not pair up with its received values and "
                            "their holes")
        template = StepTemplate(unpack_nodes(packed.nodes), lists["carry_holes"], lists["carry_next"],
                                packed.counts, packed.rows)
        for name, values in lists.items():
            setattr(template, name, values)
        template.optional_holes = optional_holes
        templates.append(template)
    return LoopSpec(templates, message.n_carried, list(message.outer_ids), list(zip(pairs[::2], pairs[1::2])),
                    message.rounds, message.n_steps, message.first_step, message.n_rows, message.batch_size,
                    message.shuffle, message.shuffle_seed, list(message.sync_templates), message.sync_every,
                    list(message.before_first), message.close_after_s)
