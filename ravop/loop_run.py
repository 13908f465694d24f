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
from .interpreter import op_seed, run_op
from .ops.optim import IN_PLACE
from .wire import unpack_nodes

NOT_KERNELS = ("const", "loop", "loop_hole")


class StepError(Exception):
    """A kernel of a step raised, or produced more than its watcher allows (`over_budget`); `node` is its plan
    row (op, source line), `step` the run's index."""

    def __init__(self, node, step, message, over_budget=False):
        super().__init__(message)
        self.node, self.step, self.over_budget = node, step, over_budget


def stream_id(node_id, stride, step_index, run):
    """The id whose `op_seed(graph_seed, id)` an op of a step draws from at one run: the recorded op id plus
    `run * stride` in a folded user loop (the unrolled op's own stream), else one of the op and the step's
    index, distinct per run and never an op's own id."""
    return ((step_index + 1) << 32) | node_id if stride is None else node_id + stride * run


class StepFunction:
    """One template, bound to the loop's outer values."""

    def __init__(self, template, outer, n_carried, graph_seed, device, owned=(), watcher=None):
        """`watcher`: None, or an object with `limits` (per op, the bytes above which its output is looked at)
        and `problem(index, value)` (why op `index`'s output is refused, or None): a worker's memory rules."""
        device = str(device)
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
        self.run_holes = self._run_holes(template, outer, define)
        strides = dict(zip(template.seeded_nodes, template.seed_strides))
        if len(strides) != len(template.seeded_nodes) or len(template.seed_strides) != len(strides):
            raise PlanError("a loop step's seeded ops and their strides do not pair up")
        seed_params = dict(zip(template.seed_param_nodes, template.seed_param_sources))
        if len(seed_params) != len(template.seed_param_nodes) or len(template.seed_param_sources) != len(seed_params):
            raise PlanError("a loop step's seed params and their sources do not pair up")
        ids = {row.id for row in rows}
        unknown = sorted((set(strides) | set(seed_params) | set(seed_params.values())) - ids)
        if unknown:
            raise PlanError(f"a loop step seeds values {unknown[:5]}, which are not its ops")
        counted = set(template.counter_nodes)
        self.ops, self.nodes = [], rows
        for row in rows:
            opdef = registry.REGISTRY.get(row.op)
            if opdef is None or row.op in NOT_KERNELS:
                raise PlanError(f"unknown op {row.op!r} in a loop step", row)
            missing = [i for i in row.inputs if i not in slot]
            if missing:
                raise PlanError(f"op {row.op!r} (node {row.id}) of a loop step reads values {missing}, which are "
                                "neither holes, inputs of the loop nor computed before it", row)
            params = row.params
            counter = None
            if row.id in counted:
                counter = params.get("step")
                if type(counter) is not int:
                    raise PlanError(f"op {row.op!r} counts steps but has no int `step` param", row)
            random = (row.id, strides.get(row.id)) if opdef.random else None
            seed_from = None
            if row.id in seed_params:
                if type(params.get("seed")) is not int:
                    raise PlanError(f"op {row.op!r} of a loop step is given a seed but has no int `seed` param", row)
                source = seed_params[row.id]
                seed_from = (source, strides.get(source))
            self.ops.append((opdef if random else _on_device(opdef, device), tuple(slot[i] for i in row.inputs),
                             params, define(row.id, row), random, counter, seed_from))
        self.values.extend([None] * (len(slot) - len(self.values)))
        for i in list(template.carry_next) + list(template.output_nodes):
            if i not in slot:
                raise PlanError(f"a loop step names value {i} as a result but does not define it")
        self.next_slots = [slot[i] for i in template.carry_next]
        self.output_slots = [slot[i] for i in template.output_nodes]
        self._update_in_place({self.carry_slots[k] for k in owned}, [row.op for row in rows])
        self.graph_seed, self.device = graph_seed, device
        self.watcher = watcher

    @staticmethod
    def _run_holes(template, outer, define):
        """[(slot, [value at run r])] of the values that differ per run (`run_holes`, `run_values`)."""
        holes, table = list(template.run_holes), list(template.run_values)
        if not holes:
            if table:
                raise PlanError("a loop step lists values per run but no holes for them")
            return []
        if len(table) % len(holes):
            raise PlanError(f"a loop step's {len(table)} values per run do not fill its {len(holes)} holes evenly")
        unknown = sorted({i for i in table if i not in outer})
        if unknown:
            raise PlanError(f"a loop step reads values {unknown[:5]} per run, which are not inputs of the loop")
        return [(define(hole), [outer[i] for i in table[h::len(holes)]]) for h, hole in enumerate(holes)]

    def runs(self):
        """How many runs the step's per-run values cover (None: any number)."""
        return len(self.run_holes[0][1]) if self.run_holes else None

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
            _, args, *rest = self.ops[index]
            targets = [args[p] for p in overwritten]
            if len(set(targets)) == len(targets) and all(
                    t in owned and t not in kept and last_read[t] == index for t in targets):
                self.ops[index] = (kernel, args, *rest)

    def __call__(self, carried, rows, count, step_index, run=0):
        """(carried values after the step, persisted values) of one run; `rows`: the batch's row indices (a
        slice or an index tensor), `count`: training steps run before this one, `run`: the runs of this
        template before this one."""
        values = self.values
        for s, value in zip(self.carry_slots, carried):
            values[s] = value
        for s, data in self.rows:
            values[s] = data[rows] if type(rows) is slice else data.index_select(0, rows)
        for s, per_run in self.run_holes:
            values[s] = per_run[run]
        index = 0
        limits = None if self.watcher is None else self.watcher.limits
        try:
            for index, (kernel, args, params, out, random, counter, seed_from) in enumerate(self.ops):
                if counter is not None:
                    params = {**params, "step": counter + count}
                if seed_from is not None:
                    params = {**params, "seed": op_seed(self.graph_seed, stream_id(*seed_from, step_index, run))}
                if random is None:
                    values[out] = kernel(*[values[a] for a in args], **params)
                else:   # drawn as run_op draws: the same numbers on any device
                    values[out] = run_op(kernel, [values[a] for a in args], params, self.graph_seed,
                                         stream_id(*random, step_index, run), self.device)
                if limits is not None and type(values[out]) is torch.Tensor and values[out].nbytes > limits[index]:
                    problem = self.watcher.problem(index, values[out])
                    if problem is not None:
                        raise StepError(self.nodes[index], step_index, problem, over_budget=True)
        except StepError:
            raise
        except Exception as exc:  # the user's error: report it with their op and line
            raise StepError(self.nodes[index], step_index, f"{type(exc).__name__}: {exc}") from exc
        return [values[s] for s in self.next_slots], [values[s] for s in self.output_slots]


class LoopRun:
    """A loop ready to run: `inputs` are the loop op's input values (carried initial values, then the outer
    values), on `device`."""

    def __init__(self, loop, inputs, graph_seed, device="cpu", watch=None):
        """`watch(template, defined ids)`: the watcher of a template's outputs (see StepFunction), or None."""
        if len(inputs) != len(loop.outer_ids) or loop.n_carried > len(inputs):
            raise PlanError(f"the loop op has {len(inputs)} inputs but its plan names {len(loop.outer_ids)} "
                            f"({loop.n_carried} carried)")
        self.loop = loop
        self.initial = list(inputs[:loop.n_carried])
        outer = dict(zip(loop.outer_ids, inputs))
        self.owned = _owned(loop)
        self.steps = [StepFunction(t, outer, loop.n_carried, graph_seed, device, self.owned,
                                   None if watch is None else watch(t, _defined(t, outer)))
                      for t in loop.templates]
        pairs = list(loop.schedule)
        if len(pairs) % 2:
            raise PlanError("a loop schedule is (template, times) pairs")
        self.schedule = list(zip(pairs[::2], pairs[1::2]))
        if any(t >= len(self.steps) for t, _ in self.schedule):
            raise PlanError("a loop schedule names a template the loop does not have")
        self.row_counts = [int(t.rows) if t.row_holes else 0 for t in loop.templates]
        per_round = sum(times for _, times in self.schedule)
        if loop.first_step + loop.n_steps > per_round * loop.rounds:
            raise PlanError(f"the loop declares steps {loop.first_step}..{loop.first_step + loop.n_steps} but its "
                            f"schedule runs {per_round * loop.rounds}")
        if any(self.row_counts) and (loop.batch_size < 1 or loop.n_rows < 1):
            raise PlanError("a loop step slices rows but the loop has no batches")
        runs = [loop.rounds * sum(times for u, times in self.schedule if u == t) for t in range(len(self.steps))]
        for t, (step, n) in enumerate(zip(self.steps, runs)):
            if step.runs() not in (None, n):
                raise PlanError(f"loop step {t} runs {n} times but has values for {step.runs()} runs")
        self.device = device

    def positions(self):
        """(template, round, first row, training steps before, run index of the template) of every step of
        the schedule's rounds up to the loop's last (`first_step + n_steps`)."""
        runs = [0] * len(self.steps)
        count, index, end = 0, 0, self.loop.first_step + self.loop.n_steps
        counts = [t.counts for t in self.loop.templates]
        if not end:
            return  # no step at all, however many rounds a (hostile) plan declares
        for r in range(self.loop.rounds):
            position = 0
            for t, times in self.schedule:
                for _ in range(times):
                    if index == end:
                        return
                    yield t, r, position, count, runs[t]
                    runs[t] += 1
                    position += self.row_counts[t]
                    count += counts[t]
                    index += 1

    def run(self, carried=None, start=0, on_step=None):
        """Run the loop's steps from its `start`-th with `carried` (the initial values by default); after each
        step `on_step(steps done, template, run index, persisted values, carried values)`, counted from the
        loop's first step (a segment's `first_step`). Returns the carried values after the last step."""
        carried = list(self.initial if carried is None else carried)
        for k in self.owned:   # the loop updates these in place: never the caller's tensors
            carried[k] = carried[k].clone()
        loop = self.loop
        rng = np.random.default_rng(loop.shuffle_seed) if loop.shuffle else None
        order, order_round = None, -1
        first = loop.first_step
        first_runs = [0] * len(self.steps)   # each template's runs before the segment
        with torch.no_grad():
            for index, (t, r, position, count, run) in enumerate(self.positions()):
                if rng is not None and r != order_round:
                    permutation = rng.permutation(int(loop.n_rows))   # drawn for skipped rounds too
                    order_round = r
                    order = None
                if index < first:
                    first_runs[t] += 1
                if index < first + start:
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
                carried, outputs = self.steps[t](carried, rows, count, index, run)
                if on_step is not None:
                    on_step(index + 1 - first, t, run - first_runs[t], outputs, carried)
        return carried


def _defined(template, outer):
    """The ids a template reads without computing them: the loop's inputs and its holes."""
    return [*outer, *template.carry_holes, *template.row_holes, *template.run_holes]


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


def _on_device(opdef, device):
    """The callable that runs `opdef` on `device` as `run_op` would: an op that makes its tensors from params
    alone (`creates`) runs with the device as torch's default device; other kernels follow their inputs."""
    if not opdef.creates or device == "cpu":
        return opdef.kernel

    def create(*args, **params):
        return run_op(opdef, list(args), params, device=device)
    return create
