"""Run a loop (`plan_pb2.Loop`, recorded by `ravop.loop`): each step template is checked and built once into a
`StepFunction`, a flat list of (kernel, argument slots, params, result slot) over a list of values, so a run of
the step does no decoding, validation or dictionary lookup; `LoopRun` runs the schedule, slicing each step's
batch from the data on the device. Used by workers (with checkpoints and persisted values, `worker.loop`) and
by `ravop.interpreter.evaluate`.

A template comes from the network: every op must be a registered kernel op, every value read defined before,
and every id the loop names must exist, or `PlanError` says which.
"""
import numpy as np
import torch

from . import registry
from .errors import PlanError
from .interpreter import op_seed
from .ops.optim import IN_PLACE
from .wire import decode_params, unpack_nodes

NOT_KERNELS = ("const", "loop", "loop_hole")


class StepError(Exception):
    """A kernel of a step raised; `node` is its plan row (op, source line), `step` the run's index."""

    def __init__(self, node, step, message):
        super().__init__(message)
        self.node, self.step = node, step


def run_seed(graph_seed, node_id, step_index):
    """The seed of a random op at one run of its step: distinct per run, and never an op id's own seed."""
    return op_seed(graph_seed, ((step_index + 1) << 32) | node_id)


class StepFunction:
    """One template, bound to the loop's outer values."""

    def __init__(self, template, outer, n_carried, graph_seed, device, owned=()):
        rows = unpack_nodes(template.nodes)
        if len(template.carry_holes) != n_carried or len(template.carry_next) != n_carried:
            raise PlanError(f"a loop step names {len(template.carry_holes)} carried holes and "
                            f"{len(template.carry_next)} next values for {n_carried} carried values")
        if len(template.row_holes) != len(template.row_data):
            raise PlanError("a loop step's row holes and their data do not pair up")
        slot = {}

        def define(node_id, row=None):
            if node_id in slot:
                raise PlanError(f"value {node_id} is defined twice in a loop step", row)
            slot[node_id] = len(slot)
            return slot[node_id]

        self.values = []
        for node_id, value in outer.items():
            define(node_id)
            self.values.append(value)
        self.carry_slots = [define(i) for i in template.carry_holes]
        self.rows = []   # (slot, data value)
        for hole, data in zip(template.row_holes, template.row_data):
            if data not in outer:
                raise PlanError(f"a loop step slices rows of {data}, which is not an input of the loop")
            self.rows.append((define(hole), outer[data]))
        counted = set(template.counter_nodes)
        self.ops, self.nodes = [], rows
        params_of = {}
        for row in rows:
            opdef = registry.REGISTRY.get(row.op)
            if opdef is None or row.op in NOT_KERNELS:
                raise PlanError(f"unknown op {row.op!r} in a loop step", row)
            missing = [i for i in row.inputs if i not in slot]
            if missing:
                raise PlanError(f"op {row.op!r} (node {row.id}) of a loop step reads values {missing}, which are "
                                "neither holes, inputs of the loop nor computed before it", row)
            params = params_of.get(row.params)
            if params is None:
                try:
                    params = params_of[row.params] = decode_params(row.params)
                except ValueError as exc:
                    raise PlanError(f"op {row.op!r}: {exc}", row) from None
            counter = None
            if row.id in counted:
                counter = params.get("step")
                if type(counter) is not int:
                    raise PlanError(f"op {row.op!r} counts steps but has no int `step` param", row)
            self.ops.append((opdef.kernel, tuple(slot[i] for i in row.inputs), params, define(row.id, row),
                             row.id if opdef.random else None, counter))
        self.values.extend([None] * (len(slot) - len(self.values)))
        for i in list(template.carry_next) + list(template.output_nodes):
            if i not in slot:
                raise PlanError(f"a loop step names value {i} as a result but does not define it")
        self.next_slots = [slot[i] for i in template.carry_next]
        self.output_slots = [slot[i] for i in template.output_nodes]
        self._update_in_place({self.carry_slots[k] for k in owned}, [row.op for row in rows])
        self.graph_seed, self.device = graph_seed, device

    def _update_in_place(self, owned, ops):
        """Give the trailing optimizer steps their in-place kernels where every value they overwrite is an
        owned carried value (see `LoopRun`) that nothing reads after them and the step does not hand on."""
        kept = set(self.next_slots) | set(self.output_slots)
        last_read = {}
        for index, (_, args, *_) in enumerate(self.ops):
            for a in args:
                last_read[a] = index
        for index in range(len(self.ops) - 1, -1, -1):
            if ops[index] == "tuple_get":
                continue
            in_place = IN_PLACE.get(ops[index])
            if in_place is None:
                return   # the block of optimizer steps at the end of the step is over
            kernel, overwritten = in_place
            _, args, params, out, random_id, counter = self.ops[index]
            targets = [args[p] for p in overwritten]
            if len(set(targets)) == len(targets) and all(
                    t in owned and t not in kept and last_read[t] == index for t in targets):
                self.ops[index] = (kernel, args, params, out, random_id, counter)

    def __call__(self, carried, rows, count, step_index):
        """(carried values after the step, persisted values) of one run; `rows`: the batch's row indices (a
        slice or an index tensor), `count`: training steps run before this one."""
        values = self.values
        for s, value in zip(self.carry_slots, carried):
            values[s] = value
        for s, data in self.rows:
            values[s] = data[rows] if type(rows) is slice else data.index_select(0, rows)
        index = 0
        try:
            for index, (kernel, args, params, out, random_id, counter) in enumerate(self.ops):
                if counter is not None:
                    params = {**params, "step": counter + count}
                if random_id is not None:
                    generator = torch.Generator(device=self.device)
                    params = {**params, "generator": generator.manual_seed(
                        run_seed(self.graph_seed, random_id, step_index))}
                values[out] = kernel(*[values[a] for a in args], **params)
        except Exception as exc:  # the user's error: report it with their op and line
            raise StepError(self.nodes[index], step_index, f"{type(exc).__name__}: {exc}") from exc
        return [values[s] for s in self.next_slots], [values[s] for s in self.output_slots]


class LoopRun:
    """A loop ready to run: `inputs` are the loop op's input values (carried initial values, then the outer
    values), on `device`."""

    def __init__(self, loop, inputs, graph_seed, device="cpu"):
        if len(inputs) != len(loop.outer_ids) or loop.n_carried > len(inputs):
            raise PlanError(f"the loop op has {len(inputs)} inputs but its plan names {len(loop.outer_ids)} "
                            f"({loop.n_carried} carried)")
        self.loop = loop
        self.initial = list(inputs[:loop.n_carried])
        outer = dict(zip(loop.outer_ids, inputs))
        self.owned = _owned(loop)
        self.steps = [StepFunction(t, outer, loop.n_carried, graph_seed, device, self.owned)
                      for t in loop.templates]
        pairs = list(loop.schedule)
        if len(pairs) % 2:
            raise PlanError("a loop schedule is (template, times) pairs")
        self.schedule = list(zip(pairs[::2], pairs[1::2]))
        if any(t >= len(self.steps) for t, _ in self.schedule):
            raise PlanError("a loop schedule names a template the loop does not have")
        self.row_counts = [int(t.rows) if t.row_holes else 0 for t in loop.templates]
        per_round = sum(times for _, times in self.schedule)
        if per_round * loop.rounds != loop.n_steps:
            raise PlanError(f"the loop declares {loop.n_steps} steps but its schedule runs "
                            f"{per_round * loop.rounds}")
        if any(self.row_counts) and (loop.batch_size < 1 or loop.n_rows < 1):
            raise PlanError("a loop step slices rows but the loop has no batches")
        self.device = device

    def positions(self):
        """(template, round, first row, training steps before, run index of the template) of every step."""
        runs = [0] * len(self.steps)
        count = 0
        counts = [t.counts for t in self.loop.templates]
        if not any(times for _, times in self.schedule):
            return  # no step at all, however many rounds a (hostile) plan declares
        for r in range(self.loop.rounds):
            position = 0
            for t, times in self.schedule:
                for _ in range(times):
                    yield t, r, position, count, runs[t]
                    runs[t] += 1
                    position += self.row_counts[t]
                    count += counts[t]

    def run(self, carried=None, start=0, on_step=None):
        """Run steps `start`.. with `carried` (the initial values by default); after each step
        `on_step(steps done, template, run index, persisted values, carried values)`. Returns the carried
        values after the last step."""
        carried = list(self.initial if carried is None else carried)
        for k in self.owned:   # the loop updates these in place: never the caller's tensors
            carried[k] = carried[k].clone()
        loop = self.loop
        rng = np.random.default_rng(loop.shuffle_seed) if loop.shuffle else None
        order, order_round = None, -1
        with torch.no_grad():
            for index, (t, r, position, count, run) in enumerate(self.positions()):
                if rng is not None and r != order_round:
                    permutation = rng.permutation(int(loop.n_rows))   # drawn for skipped rounds too
                    order_round = r
                    order = None
                if index < start:
                    continue
                n = self.row_counts[t]
                rows = None
                if n:
                    if rng is None:
                        rows = slice(position, position + n)
                    else:
                        if order is None:
                            order = torch.from_numpy(permutation).to(self.device)
                        rows = order[position:position + n]
                carried, outputs = self.steps[t](carried, rows, count, index)
                if on_step is not None:
                    on_step(index + 1, t, run, outputs, carried)
        return carried


def _owned(loop):
    """The carried values the loop owns: in every template, the step makes its next value with an op (or
    passes it through), and never persists it. From the second step on they are tensors no one else holds, so
    optimizer steps may update them in place; the initial values are copied once."""
    owned = set(range(loop.n_carried))
    for template in loop.templates:
        made = set(template.nodes.id)
        persisted = set(template.output_nodes)
        for k, (hole, after) in enumerate(zip(template.carry_holes, template.carry_next)):
            if (after not in made and after != hole) or after in persisted or hole in persisted:
                owned.discard(k)
    return owned
