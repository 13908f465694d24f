"""Folding hand-written training loops: steps a user script recorded again and again become one `loop` op.

A script that loops over its batches itself (`for X_batch, y_batch in batch_iterator(...)` around
`_forward_pass`/`_backward_pass`, or raw ops) records the same step N times. This pass finds such repeats and
replaces them with a loop op whose template is the step, as `ravop.record.loop` records `fit`
(docs/users/training_loops.md): the plan holds the step once, one worker runs it N times with the carried values
in memory, and the numbers are the unrolled steps' bit for bit.

Finding a repeat. Every op but the constants gets a kind: op, params (an op's step `counter` or `seed_param`
masked, the flags ravop/core/registry.py declares), shapes,
dtypes, which inputs are constants, and how many names persist it. A repeated step of P ops is a stretch where
the kinds repeat with period P; the candidate periods are the most frequent distances between two ops of one
kind. Each stretch is then checked step by step with the step's references as holes: an input of step k is
one of its own ops (by position), the op at position p of step k-1 (a carried value: parameters, optimizer
moments, BatchNorm stats; at step 0, one value from before the loop per position), a value from before the
loop (the same at every step), or a constant (the same at every step after content addressing, or one per
step: the batch, a learning rate set per epoch). Step counters must advance by one per step, random ops' ids
by a fixed stride (each run draws the unrolled op's own stream) and seed params must be their op's seed. A step
that differs (a short last batch, a branch on the epoch, a changed hyperparameter in the params) ends the
stretch: it stays as recorded, and the steps around it fold on their own.

After the loop only its results may be read: the carried values after the last folded step. If something
later reads another value of a folded step, the loop stops one step earlier (that step stays unrolled), or
the stretch is not folded.
"""
from collections import Counter, defaultdict
from itertools import count
from typing import Any, Iterator, Optional, Sequence, cast

from ravop.core.loop_template import (CarriedSlot, LoopRecord, LoopSpec, RunHole, SeededOp, SeedFollower, StepOutput,
                                      StepTemplate, hole_node)
from ravop.core.node import Node
from ravop.core.registry import (HOLE, INPUTS, LOOP, LOOP_INDEX, LOOPS, NOT_KERNELS, PICKS, PROJECTION, REGISTRY,
                                 op_of_kind)
from ravop.record.loop import counter_of, seed_of
from ravop.runtime.runner import op_seed
from ravop.wire import encode_params

from ..ir import IR

MIN_STEPS = 2           # fewer repeats are no loop
CANDIDATE_PERIODS = 8   # the most frequent distances between ops of one kind, tried as the step's length
MAX_CONSTANT_DEPTH = 2  # ops computed from constants alone that count as values (_constant_expressions)
CONST = ("constant",)   # the reference to a constant input (which one is recorded per step)
# A reference to an input: CONST, ("in", position in the step), ("prev", position), ("outer", node id).
Ref = tuple[Any, ...]


def fold_repeated_steps(ir: IR) -> tuple[IR, int]:
    """Returns (ir, number of ops replaced by loop templates)."""
    total = 0
    while True:
        ir, removed = _fold_once(ir)
        if not removed:
            return ir, total
        total += removed


def _fold_once(ir: IR) -> tuple[IR, int]:
    """Fold every foldable stretch of the best period found; (ir, ops removed)."""
    nodes = ir.nodes
    constant = _constant_expressions(nodes)
    order = [id for id in nodes if id not in constant]
    if len(order) < 2 * MIN_STEPS:
        return ir, 0
    names: defaultdict[int, list[str]] = defaultdict(list)
    for name, id in ir.outputs.items():
        names[id].append(name)
    kinds = _kinds(nodes, order, names, constant)
    pos = {id: k for k, id in enumerate(order)}
    last_reader = [-1] * len(order)
    for k, id in enumerate(order):
        for i in nodes[id].inputs:
            if i in pos:
                last_reader[pos[i]] = k
    context = _Context(ir, order, pos, names, last_reader, constant)
    candidates: list[tuple[int, int, list[tuple[int, int]]]] = []
    for period in _periods(kinds):
        runs: list[tuple[int, int]] = []
        for start, end in _runs(kinds, period):
            start += _phase(context, start, end, period)
            runs.append((start, (end - start) // period))
        candidates.append((sum((steps - 1) * period for _, steps in runs), period, runs))
    for _, period, runs in sorted(candidates, key=lambda c: -c[0]):
        folds: list[_Fold] = []
        end = 0
        for start, steps in runs:   # stretches of one period may overlap by less than a period
            fold = _verify(context, start, period, steps) if steps >= MIN_STEPS and start >= end else None
            if fold is not None:
                folds.append(fold)
                end = fold.start + fold.steps * period
        if folds:
            return _apply(ir, context, folds)
    return ir, 0


class _Context:
    __slots__ = ("ir", "order", "pos", "names", "last_reader", "constant")

    def __init__(self, ir: IR, order: list[int], pos: dict[int, int], names: dict[int, list[str]],
                 last_reader: list[int], constant: set[int]) -> None:
        self.ir, self.order, self.pos, self.names, self.last_reader = ir, order, pos, names, last_reader
        self.constant = constant


def _constant_expressions(nodes: dict[int, Node]) -> set[int]:
    """Ids of the constants and of the deterministic single-output ops at most MAX_CONSTANT_DEPTH ops from
    constants alone (a cast of `R.t(X_batch)`, zeros): values, not ops of a step. A step reads them like
    constants, one per run; CSE merges those a later epoch records again, so as ops they would make that
    epoch's steps look different. Deeper ones are the program itself (a raw-op loop on constant tensors)."""
    depth: dict[int, int] = {}
    for id, node in nodes.items():
        if node.op in INPUTS:
            depth[id] = 0
        elif not node.multi_output and REGISTRY[node.op].deterministic and node.op not in NOT_KERNELS \
                and all(i in depth for i in node.inputs):
            deepest = 1 + max((depth[i] for i in node.inputs), default=0)
            if deepest <= MAX_CONSTANT_DEPTH:
                depth[id] = deepest
    return set(depth)


def _kinds(nodes: dict[int, Node], order: list[int], names: dict[int, list[str]], constant: set[int]) -> list[int]:
    """A small int per op: equal for ops that may stand at the same place of two steps."""
    table: dict[tuple[Any, ...], int] = {}
    kinds: list[int] = []
    for id in order:
        node = nodes[id]
        key: tuple[Any, ...]
        if node.op in NOT_KERNELS or any(nodes[i].op in LOOPS for i in node.inputs):
            key = ("unique", id)   # a loop (of `fit`) and its results are never part of a folded step
        else:
            key = (node.op, _masked_pkey(node), node.shape, node.dtype, tuple([i in constant for i in node.inputs]),
                   len(names[id]) if id in names else 0)
        kinds.append(table.setdefault(key, len(table)))
    return kinds


def _masked_pkey(node: Node) -> bytes:
    """The node's params as wire JSON with its step counter and followed seed (which change from step to step)
    masked."""
    opdef = REGISTRY[node.op]
    masked: dict[Any, str] = {name: "_" for name, value in ((opdef.counter, counter_of(node)), (opdef.seed_param, seed_of(node)))
              if value is not None}
    return encode_params({**node.params, **masked}) if masked else node.pkey


def _periods(kinds: list[int]) -> list[int]:
    """Candidate step lengths: the distances between two successive ops of one kind that occur most often, and
    those that cover the most ops (occurrences times distance). A step that repeats ops inside itself (a
    transformer's layers and heads, one Adam update per parameter) makes short distances the most frequent,
    and its own length, the distance of the kinds that occur once per step, ranks far below them by count
    (examples/gpt_sort.py: 340, ninth after 8, 4, 25, ...); by coverage it ranks first."""
    last: dict[int, int] = {}
    distances: Counter[int] = Counter()
    for k, kind in enumerate(kinds):
        j = last.get(kind)
        if j is not None:
            distances[k - j] += 1
        last[kind] = k
    by_count = [period for period, _ in distances.most_common(CANDIDATE_PERIODS)]
    by_coverage = sorted(distances, key=lambda period: (-distances[period] * period, period))[:CANDIDATE_PERIODS]
    return list(dict.fromkeys(by_count + by_coverage))


def _runs(kinds: list[int], period: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each stretch of at least MIN_STEPS periods whose kinds repeat with `period`."""
    n, i = len(kinds), 0
    while i + period < n:
        if kinds[i] != kinds[i + period]:
            i += 1
            continue
        j = i + 1
        while j + period < n and kinds[j] == kinds[j + period]:
            j += 1
        if j - i >= (MIN_STEPS - 1) * period:
            yield i, j + period
        i = j


def _phase(context: _Context, start: int, end: int, period: int) -> int:
    """Where in a periodic stretch a step should begin: the offset from `start` (below `period`) at which the
    fewest values cross from one step to the next (the carried values), measured on a period in the middle.
    Any offset folds correctly; this one carries the parameters and optimizer state rather than activations,
    and never separates a multi-output op from its tuple_gets."""
    middle = start + ((end - start) // period // 2) * period
    crossing = [0] * (period + 1)   # difference array over the offsets of one period, then its wrap-around
    reader, nodes, order = context.last_reader, context.ir.nodes, context.order
    for y in range(max(start, middle - period), min(middle, end)):
        last = min(reader[y], y + period - 1, end - 1)
        if last <= y:
            continue
        weight = period + 1 if nodes[order[y]].multi_output else 1
        a, b = (y + 1 - start) % period, (last - start) % period   # cuts at offsets a..b (cyclically) cross
        crossing[a] += weight
        if a <= b:
            crossing[b + 1] -= weight
        else:
            crossing[period] -= weight
            crossing[0] += weight
            crossing[b + 1] -= weight
    best: Optional[int] = None
    best_offset = running = 0
    for offset in range(period):
        running += crossing[offset]
        if best is None or running < best:
            best, best_offset = running, offset
    return best_offset


def _references(context: _Context, start: int, period: int, k: int
                ) -> Optional[tuple[list[tuple[Ref, ...]], list[int]]]:
    """(references of each op's inputs, constant ids in input order) of step k of a stretch, or None if an op
    reads further back than the step before it, or a multi-output value from outside its step."""
    nodes, pos, constant = context.ir.nodes, context.pos, context.constant
    s = start + k * period
    refs: list[tuple[Ref, ...]] = []
    consts: list[int] = []
    for id in context.order[s:s + period]:
        row: list[Ref] = []
        for i in nodes[id].inputs:
            if i in constant:
                row.append(CONST)
                consts.append(i)
                continue
            p = pos[i]
            if p >= s:
                row.append(("in", p - s))
            elif nodes[i].multi_output:
                return None
            elif k and p >= s - period:
                row.append(("prev", p - s + period))
            elif p < start:
                row.append(("outer", i))
            else:
                return None
        refs.append(tuple(row))
    return refs, consts


class _Fold:
    """A stretch that folds: `steps` steps of `period` ops from position `start`."""
    __slots__ = ("start", "period", "steps", "refs", "initial", "consts", "counters", "strides", "seed_params")
    start: int
    period: int
    steps: int
    refs: list[tuple[Ref, ...]]      # per op of the step: the references of its inputs
    initial: dict[int, int]           # carried position -> the id it starts from
    consts: list[list[int]]           # per step: its constant inputs in order
    counters: dict[int, int]          # position of a step counter -> its advance per step
    strides: dict[int, int]           # position -> how far its id advances per step
    seed_params: dict[int, Optional[int]]   # position of a seed param -> the position of its source, or None


def _verify(context: _Context, start: int, period: int, steps: int) -> Optional[_Fold]:
    """The longest foldable prefix of the stretch (a _Fold), starting at its step 0 or 1; else None."""
    for first in (0, 1):
        if steps - first < MIN_STEPS:
            return None
        fold = _verify_from(context, start + first * period, period, steps - first)
        if fold is not None:
            return fold
    return None


def _verify_from(context: _Context, start: int, period: int, steps: int) -> Optional[_Fold]:
    ir, order = context.ir, context.order
    nodes = ir.nodes
    template = _references(context, start, period, 1)
    first = _references(context, start, period, 0)
    if template is None or first is None:
        return None
    initial: dict[int, int] = {}
    for row, row0 in zip(template[0], first[0]):
        for ref, ref0 in zip(row, row0):
            if ref[0] == "prev":
                if ref0[0] != "outer" or initial.setdefault(ref[1], ref0[1]) != ref0[1]:
                    return None
            elif ref != ref0:
                return None
    ids = [order[start:start + period], order[start + period:start + 2 * period]]
    for p, value in initial.items():
        carried, before = nodes[ids[0][p]], nodes[value]
        if carried.shape != before.shape or carried.dtype != before.dtype:
            return None
    # Per position: optimizer counters (advance by 0 or 1 per step), random ops and the sources of seed
    # params (ids advance by a stride), seed params (the seed of their source's id, or fixed).
    counters: dict[int, int] = {}
    strided: set[int] = set()
    seed_params: dict[int, Optional[int]] = {}
    streams: Optional[dict[int, int]] = None
    for q, (id0, id1) in enumerate(zip(*ids)):
        node0, node1 = nodes[id0], nodes[id1]
        if REGISTRY[node0.op].random:
            strided.add(q)
        step0, step1 = counter_of(node0), counter_of(node1)
        if step0 is not None:
            if step1 is None or step1 - step0 not in (0, 1):
                return None
            counters[q] = step1 - step0
        seed0 = seed_of(node0)
        if seed0 is not None:
            if streams is None:
                streams = {op_seed(ir.seed, id): q for q, id in enumerate(ids[0])}
            source = streams.get(seed0)
            seed_params[q] = source
            if source is not None:
                strided.add(source)
    strides = {q: ids[1][q] - ids[0][q] for q in strided}
    consts = [first[1], template[1]]
    matched = 2
    for k in range(1, steps):
        if k >= 2:
            refs = _references(context, start, period, k)
            if refs is None or refs[0] != template[0]:
                break
            consts.append(refs[1])
        if not _same_params(nodes, order, start, period, k, counters, strides, seed_params, ir.seed):
            break
        matched = k + 1
    for folded in (matched, matched - 1):
        if folded >= MIN_STEPS and _results_only_read_after(context, start, period, folded, template[0]):
            fold = _Fold()
            fold.start, fold.period, fold.steps, fold.refs = start, period, folded, template[0]
            fold.initial, fold.consts, fold.counters = initial, consts[:folded], counters
            fold.strides, fold.seed_params = strides, seed_params
            return fold
    return None


def _same_params(nodes: dict[int, Node], order: list[int], start: int, period: int, k: int,
                 counters: dict[int, int], strides: dict[int, int], seed_params: dict[int, Optional[int]],
                 graph_seed: int) -> bool:
    """Whether step k's counters, strided ids and seed params continue step 0's."""
    s = start + k * period
    for q, delta in counters.items():
        if counter_of(nodes[order[s + q]]) != cast(int, counter_of(nodes[order[start + q]])) + k * delta:
            return False
    for q, stride in strides.items():
        if order[s + q] != order[start + q] + k * stride:
            return False
    for q, source in seed_params.items():
        seed = seed_of(nodes[order[s + q]])
        want = seed_of(nodes[order[start + q]]) if source is None else op_seed(graph_seed, order[s + source])
        if seed != want:
            return False
    return True


def _carried_positions(refs: Sequence[tuple[Ref, ...]]) -> list[int]:
    return sorted({ref[1] for row in refs for ref in row if ref[0] == "prev"})


def _results_only_read_after(context: _Context, start: int, period: int, steps: int,
                             refs: Sequence[tuple[Ref, ...]]) -> bool:
    """Whether everything after the first `steps` steps reads of them only the last one's carried values."""
    end = start + steps * period
    last = end - period
    carried = set(_carried_positions(refs))
    reader = context.last_reader
    for p in range(start, end):
        if reader[p] >= end and (p < last or p - last not in carried):
            return False
    return True


def _apply(ir: IR, context: _Context, folds: list[_Fold]) -> tuple[IR, int]:
    """The IR with each fold replaced by a loop op and its tuple_gets; (ir, ops removed)."""
    nodes, order = ir.nodes, context.order
    alias: dict[int, int] = {}
    placed: dict[int, Optional[Node]] = {}
    loops = dict(ir.loops)
    dropped_names: set[str] = set()
    removed_total = 0
    for fold in folds:
        built = _build(ir, context, fold, len(loops), alias)
        if built is None:
            continue
        loop_node, results, record, names = built
        removed = order[fold.start:fold.start + fold.steps * fold.period]
        removed_total += len(removed)
        placed.update({node.id: node for node in (loop_node, *results)})
        placed.update({id: None for id in removed if id not in placed})
        last = fold.start + (fold.steps - 1) * fold.period
        for result, p in zip(results, _carried_positions(fold.refs)):
            alias[order[last + p]] = result.id
        loops[loop_node.id] = record
        dropped_names.update(names)
    if not removed_total:
        return ir, 0
    new_nodes: dict[int, Node] = {}
    for id, node in nodes.items():
        if id in placed:   # a loop op and its results read ids already aliased
            kept = placed[id]
            if kept is not None:
                new_nodes[id] = kept
            continue
        if any(i in alias for i in node.inputs):
            node = node.with_inputs(tuple(alias.get(i, i) for i in node.inputs))
        new_nodes[id] = node
    outputs = {name: id for name, id in ir.outputs.items() if name not in dropped_names}
    return ir.replace(nodes=new_nodes, outputs=outputs, loops=loops), removed_total


def _build(ir: IR, context: _Context, fold: _Fold, loop_index: int, alias: dict[int, int]
           ) -> Optional[tuple[Node, list[Node], LoopRecord, list[str]]]:
    """(loop node, its tuple_get nodes, LoopRecord, persist names moved into the loop) of a fold, or None if
    no ids are free for them between the loop's inputs and its readers."""
    nodes, order = ir.nodes, context.order
    start, period, steps = fold.start, fold.period, fold.steps
    step0 = order[start:start + period]
    carried = _carried_positions(fold.refs)
    if not carried:
        return None   # independent repeats (no state flows between them) are no loop
    fresh = count(ir.n_recorded)   # ids local to the template, clear of the graph's
    holes = {p: next(fresh) for p in carried}
    initial_names = [next(fresh) for _ in carried]
    outer: dict[int, int] = {}   # template name -> the loop input's id
    run_holes: dict[tuple[int, ...], int] = {}   # sequence of constant ids -> hole id
    rows: list[Node] = []
    const_slot = 0
    for q, (id, refs) in enumerate(zip(step0, fold.refs)):
        node = nodes[id]
        inputs: list[int] = []
        for ref in refs:
            if ref == CONST:
                sequence = tuple(consts[const_slot] for consts in fold.consts)
                const_slot += 1
                if len(set(sequence)) == 1:
                    outer.setdefault(sequence[0], sequence[0])
                    inputs.append(sequence[0])
                else:
                    hole = run_holes.get(sequence)
                    if hole is None:
                        hole = run_holes[sequence] = next(fresh)
                        for i in sequence:
                            outer.setdefault(i, i)
                    inputs.append(hole)
            elif ref[0] == "in":
                inputs.append(step0[ref[1]])
            elif ref[0] == "prev":
                inputs.append(holes[ref[1]])
            else:
                name: int = ref[1]
                value = alias.get(name, name)
                outer.setdefault(value, value)
                inputs.append(value)
        rows.append(Node(id, node.op, inputs, node.params, node.pkey, node.shape, node.dtype, node.source))
    initial = [alias.get(fold.initial[p], fold.initial[p]) for p in carried]
    loop_inputs = initial + list(outer.values())
    free = sorted(id for id in order[start:start + steps * period] if id > max(loop_inputs))
    if len(free) < len(carried) + 1:
        return None
    hole_op = op_of_kind(HOLE)
    template = StepTemplate(rows, [CarriedSlot(holes[p], step0[p]) for p in carried], counts=True)
    template.holes = {holes[p]: hole_node(holes[p], nodes[step0[p]], hole_op) for p in carried}
    template.counter_nodes = [step0[q] for q, delta in sorted(fold.counters.items()) if delta == 1]
    template.run_holes = [RunHole(hole, tuple(sequence[r] for r in range(steps)))
                          for sequence, hole in run_holes.items()]
    template.holes.update((hole, hole_node(hole, nodes[sequence[0]], hole_op)) for sequence, hole in run_holes.items())
    template.seeded = [SeededOp(step0[q], stride) for q, stride in sorted(fold.strides.items())]
    template.seed_followers = [SeedFollower(step0[q], step0[followed])
                               for q, followed in sorted(fold.seed_params.items()) if followed is not None]
    names: list[list[str]] = []
    for q, id in enumerate(step0):
        for j in range(len(context.names.get(id, ()))):
            template.outputs.append(StepOutput(id))
            names.append([sorted(context.names[order[start + k * period + q]])[j] for k in range(steps)])
    spec = LoopSpec([template], len(carried), initial_names + list(outer), [(0, steps)], rounds=1, n_steps=steps)
    source = nodes[step0[0]].source
    shapes = tuple(nodes[step0[p]].shape for p in carried)
    dtypes = tuple(nodes[step0[p]].dtype for p in carried)
    params = {LOOP_INDEX: loop_index}
    loop_node = Node(free[0], op_of_kind(LOOP), tuple(loop_inputs), params, encode_params(params), shapes, dtypes,
                     source)
    results: list[Node] = []
    for k, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        params = {PICKS: k}
        results.append(Node(free[k + 1], op_of_kind(PROJECTION), (loop_node.id,), params, encode_params(params),
                            shape, dtype, source))
    moved = [name for per_output in names for name in per_output]
    return loop_node, results, LoopRecord(spec, [names]), moved
