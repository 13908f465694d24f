"""`R.Graph(..., strategy=...)` over hand-written training loops: each loop the folding pass made
(compiler/passes/loops.py) becomes the strategy's resident replicas, one loop op per replica, so the plan does
not grow with the number of steps (docs/users/strategies.md, "Hand-written loops").

- The replicated model is read off the folded step: a carried value whose next value is output 0 of an optimizer
  step (an op with a step counter whose inputs start `param, grad`: adam_step, rmsprop_step, ...) or any other
  floating value the step computes itself (`w - lr * g`) is a parameter; the other outputs of an optimizer step
  are its state; the other outputs of a multi-output op (batch_norm's running statistics) and integer values are
  buffers. A loop with no parameter is no training loop, and is refused.
- The loop's steps are dealt round-robin: replica r runs the loop's steps r, r + R, r + 2R, ... (the batches
  recorded for them, persisting their values under their names), each replica a copy of the loop with its own
  optimizer step counts from the loop's first, its random ops drawing the streams of the steps it runs. The last
  `n_steps % R` steps, which make no full round, run once after the replicas, as the steps after the loop do.
- The strategy's own resident hooks (ravop.parallel.hand_written, recorded by the client at activation from what
  `folded_loops` says of each loop: the compiler records nothing) give the replicas' extra carried values, their
  sync templates (run after every `interval` steps of a replica and after its last) and the model after training,
  which everything recorded after the loop reads. Steps the folding leaves outside the loop (the first, which
  makes the optimizer state from constants; the last, whose values are persisted) run once, as recorded (their
  step counts, batches and random streams): every replica starts from the values before the loop, and what
  follows reads the strategy's final model.

The replicas' loops and the strategy's ops get ids after the recorded ones, and what reads the loop's results is
moved after them (ids ascend in topological order); a random op moved draws the stream of its new id.
"""
from dataclasses import replace
from typing import Any, Callable, Collection, NamedTuple, Optional, Sequence, cast

from ravop.core.errors import GraphStateError
from ravop.core.loop_template import CarriedSlot, LoopRecord, LoopSpec, RunHole, SeedFollower, StepTemplate
from ravop.core.node import Node
from ravop.core.registry import HOLE, INPUTS, LOOP_INDEX, PICKS, PROJECTION, PROJECTIONS, REGISTRY, op_of_kind
from ravop.parallel.hand_written import check_loop_strategy
from ravop.parallel.replicas import Carried
from ravop.record.loop import seed_of
from ravop.runtime.runner import op_seed
from ravop.wire import encode_params

from ..ir import IR

PARAM, BUFFER, OPTIMIZER = "parameter", "buffer", "optimizer state"


class FoldedLoop(NamedTuple):
    """What a strategy's replicas of one folded loop are recorded from (`ravop.parallel.hand_written
    .record_replica_loops`, by the client at activation: the compiler records nothing): the loop's carried values
    ((shape, dtype), in the layout's order), their `layout` (a `ravop.parallel.replicas.Carried`) and the training
    steps each replica runs."""
    carried: list[tuple[Any, Any]]
    layout: Carried
    steps_per_replica: int


def folded_loops(ir: IR, strategy: Any, recorded_loops: Collection[int]) -> list[FoldedLoop]:
    """The loops the folding made in `ir` that `strategy` replicates (not those in `recorded_loops`, the ids of
    loops recorded with ravop.record.loop), in id order; a clear error where it cannot."""
    check_loop_strategy(strategy)
    if recorded_loops:
        raise NotImplementedError(f"{strategy!r} over a loop recorded with ravop.record.loop.Loop is not "
                                  "implemented: a strategy applies to fit(..., strategy=...) and to hand-written "
                                  "loops the compiler folds")
    if not ir.loops:
        raise GraphStateError(f"the graph has strategy={strategy!r} but no fit used it and no hand-written "
                              "training loop folded (a loop needs at least two alike steps, each reading its "
                              "batch as a constant, R.t(X_batch); verify=k graphs do not fold)")
    return [_folded(ir, loop_id, strategy)[0] for loop_id in ir.loops]


def replicate_folded_loops(strategy: Any, recorded_loops: Collection[int],
                           replicas: Sequence[Any]) -> Callable[[IR], tuple[IR, int]]:
    """The pass for a graph whose strategy no fit used: every loop the folding made becomes the strategy's
    replicas, spliced from `replicas` (a `ravop.parallel.hand_written.ReplicaLoops` per loop of `folded_loops`,
    recorded by the client from them)."""
    def replicate(ir: IR) -> tuple[IR, int]:
        folded = folded_loops(ir, strategy, recorded_loops)
        if len(replicas) != len(folded):
            raise GraphStateError(f"{len(folded)} hand-written loops fold under {strategy!r}, and {len(replicas)} "
                                  "recordings of their replicas were given: record them from compiler.folded_loops")
        for record, scratch in zip(list(ir.loops.values()), replicas):
            loop_id = next(id for id, r in ir.loops.items() if r is record)   # a splice before moved its readers
            ir = _replicate(ir, loop_id, strategy, scratch)
        return ir, len(folded)
    return replicate


def _folded(ir: IR, loop_id: int, strategy: Any) -> tuple[FoldedLoop, list[int], str]:
    """(FoldedLoop, the folded step's carried values in the layout's order, the loop's source) of loop `loop_id`."""
    record = ir.loops[loop_id]
    spec, loop_node = record.spec, ir.nodes[loop_id]
    template = spec.templates[0]
    source = template.nodes[0].source if template.nodes else loop_node.source
    where = f"the hand-written loop at {source}"
    kinds = carried_kinds(template)
    if PARAM not in kinds:
        raise ValueError(f"{where} carries no parameter (only {', '.join(sorted(set(kinds))) or 'nothing'}), so "
                         f"it is no training loop that {strategy!r} could replicate")
    if not template.run_holes:
        raise ValueError(f"{where} reads the same values at every step (no batch recorded per step, as "
                         f"R.t(X_batch)), so {strategy!r} has no batches to share among its replicas")
    replicas, n_steps = strategy.replicas, spec.n_steps
    if n_steps < replicas:
        raise ValueError(f"{where} folds into {n_steps} alike steps, fewer than {strategy!r}'s replicas (the steps "
                         "before and after it run once): record more steps, or use fewer replicas")
    order = [k for kind in (PARAM, BUFFER, OPTIMIZER) for k, found in enumerate(kinds) if found == kind]
    layout = Carried(*(kinds.count(kind) for kind in (PARAM, BUFFER, OPTIMIZER)))
    initial = loop_node.inputs[:spec.n_carried]
    carried = [(ir.nodes[initial[k]].shape, ir.nodes[initial[k]].dtype) for k in order]
    return FoldedLoop(carried, layout, n_steps // replicas), order, source


def _replicate(ir: IR, loop_id: int, strategy: Any, scratch: Any) -> IR:
    folded, order, source = _folded(ir, loop_id, strategy)
    if len(scratch.placeholders) != len(folded.carried) or len(scratch.loops) != strategy.replicas:
        raise GraphStateError(f"the replicas given for the hand-written loop at {source} carry "
                              f"{len(scratch.placeholders)} values in {len(scratch.loops)} loops, not "
                              f"{len(folded.carried)} in {strategy.replicas}: record them from its FoldedLoop")
    initial = ir.nodes[loop_id].inputs[:ir.loops[loop_id].spec.n_carried]
    return _splice(ir, loop_id, scratch, [initial[k] for k in order], order, source)


def carried_kinds(template: StepTemplate) -> list[str]:
    """PARAM, BUFFER or OPTIMIZER for each carried value of a folded step (the module docstring's rule)."""
    rows = {node.id: node for node in template.nodes}
    kinds: list[str] = []
    for hole, after in ((c.hole, c.after) for c in template.carried):
        node = rows.get(after)
        producer = rows.get(node.inputs[0]) if node is not None and node.op in PROJECTIONS else None
        if node is not None and producer is not None and _is_optimizer_step(producer.op):
            kinds.append(PARAM if node.params[PICKS] == 0 else OPTIMIZER)
        elif producer is not None or not template.holes[hole].dtype.is_floating_point:
            kinds.append(BUFFER)
        else:
            kinds.append(PARAM)
    return kinds


def _is_optimizer_step(op: str) -> bool:
    opdef = REGISTRY[op]
    return opdef.counter is not None and opdef.inputs[:2] == ("param", "grad")


def _splice(ir: IR, loop_id: int, scratch: Any, initial: list[int], order: list[int], source: str) -> IR:
    """`ir` with the folded loop `loop_id` replaced by the scratch recording's replicas and final model, and the
    loop's last steps that make no full round of the replicas (`_tail`) run once on that model."""
    nodes, graph = ir.nodes, scratch.graph
    record = ir.loops[loop_id]
    results = {id: node.params[PICKS] for id, node in nodes.items()
               if node.op in PROJECTIONS and node.inputs[0] == loop_id}
    next_id = ir.n_recorded
    ids = {op.id: i for op, i in zip(scratch.placeholders, initial)}   # scratch id -> IR id
    added: dict[int, Node] = {}
    loops = {id: r for id, r in ir.loops.items() if id != loop_id}
    constants = dict(ir.constants)
    loop_of = {op.id: r for r, op in enumerate(scratch.loops)}
    for op in graph.nodes:
        if op.id in ids or op.id in graph.step_ids:
            continue   # a placeholder of a value the IR holds, or an op of a loop step (its template's)
        ids[op.id] = next_id
        inputs: tuple[int, ...] = tuple(ids[i.id] for i in op.inputs)
        params: dict[str, Any] = op.params or {}
        if op.id in loop_of:
            replica, outer = _replica_record(record, graph.loops[op.id], loop_of[op.id], len(scratch.loops),
                                             nodes[loop_id].inputs, order)
            loops[next_id] = replica
            inputs += tuple(outer)
            params = {LOOP_INDEX: len(loops) - 1}
        elif op.op in INPUTS:
            constants[next_id] = graph.constants[op.id]
        added[next_id] = Node(next_id, op.op, inputs, params, encode_params(params) if params else b"", op.shape,
                              op.dtype, source)
        next_id += 1
    final = [ids[scratch.final[order.index(k)].id] for k in range(record.spec.n_carried)]
    tail = _tail(record, nodes[loop_id].inputs, len(scratch.loops))
    if tail is not None:
        loops[next_id] = tail[0]
        tail_nodes = _loop_nodes(next_id, nodes[loop_id], (*final, *tail[1]), len(loops) - 1, source)
        added.update((node.id, node) for node in tail_nodes)
        final = [node.id for node in tail_nodes[1:]]
        next_id += len(tail_nodes)
    alias = {id: final[k] for id, k in results.items()}
    moved, seeds = _readers_moved(ir, loop_id, results, next_id)
    next_id += len(moved)
    kept: dict[int, Node] = {}
    for id, node in nodes.items():
        if id == loop_id or id in results:
            continue
        inputs = tuple(moved.get(i, alias.get(i, i)) for i in node.inputs)
        new_id = moved.get(id, id)
        seed = seed_of(node)
        params = node.params
        if seed in seeds:   # it follows a moved random op's stream (dropout's backward redraws its mask)
            params = {**params, cast(str, REGISTRY[node.op].seed_param): seeds[seed]}
        if new_id != id or inputs != tuple(node.inputs) or params is not node.params:
            node = Node(new_id, node.op, inputs, params, encode_params(params) if params else b"", node.shape,
                        node.dtype, node.source)
        kept[new_id] = node
        if id in loops and new_id != id:
            loops[new_id] = loops.pop(id)
    merged = dict(sorted({**kept, **added}.items()))
    outputs = {name: moved.get(id, alias.get(id, id)) for name, id in ir.outputs.items()}
    return ir.replace(nodes=merged, outputs=outputs, loops=loops, n_recorded=next_id,
                      constants={id: value for id, value in constants.items() if id in merged})


def _loop_nodes(loop_id: int, like: Node, inputs: Sequence[int], index: int, source: str) -> list[Node]:
    """A loop node carrying what the loop node `like` carries, and a tuple_get per carried value."""
    params: dict[str, Any] = {LOOP_INDEX: index}
    loop = Node(loop_id, like.op, inputs, params, encode_params(params), like.shape, like.dtype, source)
    picks: list[Node] = []
    for k, (shape, dtype) in enumerate(zip(like.shape, like.dtype)):
        params = {PICKS: k}
        picks.append(Node(loop_id + 1 + k, op_of_kind(PROJECTION), (loop_id,), params, encode_params(params), shape,
                          dtype, source))
    return [loop, *picks]


def _readers_moved(ir: IR, loop_id: int, results: Collection[int], next_id: int
                   ) -> tuple[dict[int, int], dict[int, int]]:
    """({id: new id} of what reads the loop's results, directly or not, given ids from `next_id` on, in order;
    {old stream seed: new} of the random ops among them, whose stream follows their id)."""
    moved: dict[int, int] = {}
    seeds: dict[int, int] = {}
    for id, node in ir.nodes.items():
        if id > loop_id and id not in results and any(i in results or i in moved or i == loop_id
                                                      for i in node.inputs):
            moved[id] = next_id + len(moved)
            if REGISTRY[node.op].random:
                seeds[op_seed(ir.seed, id)] = op_seed(ir.seed, moved[id])
    return moved, seeds


def _replica_record(folded: LoopRecord, scratch: LoopRecord, r: int, replicas: int, folded_inputs: Sequence[int],
                    order: list[int]) -> tuple[LoopRecord, list[int]]:
    """(LoopRecord of replica r, the IR ids its training step reads besides the scratch loop's inputs): the
    scratch loop's spec with the folded step, fed replica r's share of the runs, in place of its stand-in step;
    `order`: the folded step's carried values in the order the scratch loop carries them (the layout's)."""
    spec = folded.spec
    stand_in = scratch.spec.templates[0]
    base = 1 + max(_all_ids(spec.templates[0]) | set(spec.outer_ids))
    shift = {i: base + i for t in scratch.spec.templates for i in _all_ids(t)}
    shift.update((i, base + i) for i in scratch.spec.outer_ids)
    syncs = [_renamed(t, shift) for t in scratch.spec.templates[1:]]
    shares = spec.n_steps // replicas
    step, outer, names = _step_of_runs(folded, folded_inputs, range(r, shares * replicas, replicas), False)
    extra = [shift[c.hole] for c in stand_in.carried[len(order):]]
    step = replace(step, carried=[step.carried[k] for k in order] + [CarriedSlot(h, h) for h in extra],
                   holes={**step.holes, **{h: _hole(h, stand_in.holes[h - base]) for h in extra}})
    new_spec = replace(scratch.spec, templates=[step, *syncs],
                       outer_ids=[shift[i] for i in scratch.spec.outer_ids] + [name for name, _ in outer])
    return LoopRecord(new_spec, [names, *scratch.names[1:]]), [i for _, i in outer]


def _tail(folded: LoopRecord, folded_inputs: Sequence[int], replicas: int
          ) -> Optional[tuple[LoopRecord, list[int]]]:
    """(LoopRecord, the IR ids it reads besides the carried values) of the folded loop's last steps that make no
    full round of the replicas, run once as recorded (their step counts, batches and random streams), or None."""
    spec = folded.spec
    left = spec.n_steps % replicas
    if not left:
        return None
    step, outer, names = _step_of_runs(folded, folded_inputs, range(spec.n_steps - left, spec.n_steps), True)
    tail = LoopSpec([step], spec.n_carried, spec.outer_ids[:spec.n_carried] + [name for name, _ in outer],
                    [(0, left)], rounds=1, n_steps=left)
    return LoopRecord(tail, [names]), [i for _, i in outer]


def _step_of_runs(folded: LoopRecord, folded_inputs: Sequence[int], runs: range, as_recorded: bool
                  ) -> tuple[StepTemplate, list[tuple[int, int]], list[list[str]]]:
    """(template, [(outer name, IR id)] it reads, persist names per output) of the folded step fed the folded
    loop's `runs` (evenly spaced): their per-step values and their names; its random ops draw those runs' streams
    (node + stride * run); `as_recorded`: its step counters those of the runs, else counted from the loop's
    first (a replica's own optimizer counts)."""
    spec, template = folded.spec, folded.spec.templates[0]
    first, every = runs[0], runs.step
    step = _renamed(template, {s.node: s.node + s.stride * first for s in template.seeded})
    if as_recorded and first:
        step = replace(step, nodes=[_counted_from(node, first) if node.id in step.counter_nodes else node
                                    for node in step.nodes])
    step = replace(step, run_holes=[replace(r, values=tuple(recorded.values[run] for run in runs))
                                    for r, recorded in zip(step.run_holes, template.run_holes)],
                   seeded=[replace(s, stride=s.stride * every) for s in step.seeded])
    read = {i for node in step.nodes for i in node.inputs} | {i for r in step.run_holes for i in r.values}
    outer = [(name, i) for name, i in zip(spec.outer_ids[spec.n_carried:], folded_inputs[spec.n_carried:])
             if name in read]
    return step, outer, [[per_run[run] for run in runs] for per_run in folded.names[0]]


def _counted_from(node: Node, runs: int) -> Node:
    """`node` (an op with a step counter) as recorded `runs` steps later."""
    counter = cast(str, REGISTRY[node.op].counter)
    params = {**node.params, counter: node.params[counter] + runs}
    return Node(node.id, node.op, node.inputs, params, encode_params(params), node.shape, node.dtype, node.source)


def _hole(node_id: int, like: Node) -> Node:
    return Node(node_id, op_of_kind(HOLE), (), {}, b"", like.shape, like.dtype, like.source)


def _all_ids(template: StepTemplate) -> set[int]:
    """Every id a template names: its ops, their inputs, its holes and the values it lists."""
    ids = {node.id for node in template.nodes} | {i for node in template.nodes for i in node.inputs}
    ids |= set(template.holes) | set(template.outer_reads()) | set(template.hole_ids()) | set(template.results())
    ids |= {*template.counter_nodes, *(s.node for s in template.seeded)}
    ids |= {i for f in template.seed_followers for i in (f.node, f.source)}
    return ids


def _renamed(template: StepTemplate, names: dict[int, int]) -> StepTemplate:
    """`template` with each id in `names` renamed (ids of its own ops and holes; the loop's inputs keep theirs)."""
    def rename(i: int) -> int:
        return names.get(i, i)
    nodes = [Node(rename(n.id), n.op, [rename(i) for i in n.inputs], n.params, n.pkey, n.shape, n.dtype, n.source)
             for n in template.nodes]
    holes = {rename(h): Node(rename(h), n.op, n.inputs, n.params, n.pkey, n.shape, n.dtype, n.source)
             for h, n in template.holes.items()}
    return replace(template, nodes=nodes, holes=holes,
                   carried=[CarriedSlot(rename(c.hole), rename(c.after)) for c in template.carried],
                   row_holes=[replace(r, hole=rename(r.hole)) for r in template.row_holes],
                   run_holes=[RunHole(rename(r.hole), tuple(rename(i) for i in r.values)) for r in template.run_holes],
                   counter_nodes=[rename(i) for i in template.counter_nodes],
                   outputs=[replace(o, node=rename(o.node)) for o in template.outputs],
                   seeded=[replace(s, node=rename(s.node)) for s in template.seeded],
                   seed_followers=[SeedFollower(rename(f.node), rename(f.source)) for f in template.seed_followers],
                   received=[replace(r, hole=rename(r.hole)) for r in template.received],
                   sent=[replace(s, node=rename(s.node)) for s in template.sent])
