"""Run a loop subgraph (a `loop` op and its tuple_get readers): the steps run here, one after another, with
the carried values (parameters, optimizer state) kept in this worker's memory (`ravop.runtime.loop_run`). Its templates
are decoded once, checked as any subgraph's nodes are, and run by the same runner: a kernel error or an
allocation that fails in a step is reported as on any subgraph, with the step's number.

While it runs, the worker writes what the steps persist (the batch losses) every `FLUSH_SECONDS`, with the
number of steps done (what `R.track_progress` shows), and a checkpoint of the carried values every
`checkpoint_steps` steps or `checkpoint_seconds` seconds (by default as often as their measured cost allows),
whichever comes first. Each write is one MULTI/EXEC,
so a checkpoint and the persisted values up to it land together. The writes run in a thread beside the loop, in
order (worker/loops/background_writes.py: over a slow link a checkpoint is seconds of upload the loop need not wait
for); a checkpoint holds its step's values (copied into one host buffer: worker/loops/checkpoint_buffer.py; one
in flight at a time, worker/loops/checkpoint_cadence.py), and a failed write stops the loop at its next step with
nothing after it written. The loop waits for them when it hands itself back and at its end. A worker that takes over
the subgraph after a crash resumes from the checkpoint; steps are deterministic, so it computes the same bits,
and it writes persisted values with SET NX: a value written before the crash is never written again. A worker told
to stop (SIGTERM) checkpoints after the step it is running and hands the loop back at once.

A thread beside the loop (worker/loops/graph_watch.py) looks at the graph every quarter second: a cancelled or failed
graph ends the loop after its current step; a stop request (`ravop.tools.status.request_stop`: EarlyStopping) ends it
at its next epoch boundary as if it had been recorded with that many epochs: a checkpoint there and the graph's
`stopped` record ("stopped early at epoch k of n") are written in one transaction, the loop's outputs are its
carried values of that point, and the graph goes on (what reads them runs) to end done. A worker resuming it
resumes from that checkpoint and stops there too, so the result is the k-epoch run's, bit for bit.

A checkpoint's tensors go through the tensor store (`ravop.store.tensors`: one value each, or chunks for a
big one, so state over Redis's 512 MB value limit checkpoints too) under keys named by the step they were
taken at; the checkpoint hash, written in the transaction that publishes their headers, names that step, and the
previous checkpoint's tensors are deleted in it: the store holds one checkpoint at rest, and one in flight (a big
one's chunks go ahead of the transaction, under a marker a resumed loop deletes them by if the writer died). A
loop that exchanges values stores its values by digest instead, once for all the loops whose checkpoints hold the
same bits (worker/loops/shared_checkpoint.py), at synchronisations the graph's loops agree on
(worker/loops/sync_cadence.py).

The templates follow the rules of ordinary subgraphs (worker/execute/validate.py, worker/execute/memory.py): their
declared sizes must fit the worker's limit, and each output is checked against its declared size and the budget.
"""
import functools
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import redis

from ravop.core import graph_states
from ravop.core.errors import PlanError
from ravop.core.loop_template import LoopSpec, StepTemplate
from ravop.core.node import Node
from ravop.core.registry import LOOPS, PROJECTIONS
from ravop.runtime.loop_run import LoopRun
from ravop.runtime.runner import OpError, run_nodes
from ravop.store import tensors as stored
from ravop.store import scripts, value_writes
from ravop.store.client_types import Client
from ravop.store.keys import GraphKeys
from ravop.wire import encode_tensors, unpack_loop

from ..execute import device as devices
from ..execute import memory
from ..execute.run import kernel_error
from ..execute.cache import TensorCache
from ..execute.validate import Program, check_nodes
from . import step_decisions
from . import checkpoint_aliases, heap_hold, held_values, shared_checkpoint
from .background_writes import BackgroundWrites
from .checkpoint_buffer import CheckpointBuffer
from .checkpoint_cadence import IN_LOOP_BYTES_PER_S, CheckpointCadence
from .exchange import StoreExchange
from .graph_watch import GraphWatch
from ..serve.worker_metrics import WorkerMetrics
from .late_rounds import LateRounds, RoundClosed, droppable, mark
from .sync_cadence import SyncCadence, agree, agreed, within_round_due
from .turns import Turns

# LoopRun.run's hook after each step: (done, template, run, outputs, carried)
OnStep = Callable[[int, int, int, list[Any], list[Any]], None]
# what `_Writer._take` hands `_commit`: (done, persisted values, host copies or None, record, exchanged keys read)
_Taken = Tuple[int, Dict[int, Any], Optional[list[Any]], Optional[Dict[str, Any]], Optional[list[tuple[str, str]]]]

FLUSH_SECONDS = 0.25
# A flush (persisted values, progress, the graph's state) is one round trip that the loop waits for: over a slow
# link (a provider 50 ms from the store) flushing every 0.25 s would cost a fifth of the loop's time, so flushes are
# spaced to keep their share of the time at most 1 / FLUSH_SPACING.
FLUSH_SPACING = 20
CHECKPOINT_SECONDS = 10.0
CHECKPOINT_STEPS = 1000
# Unless --checkpoint-seconds is given, a loop checkpoints as often as its checkpoints' measured cost allows: every
# checkpoint_cadence.SPACING times what the last one cost (its host copy in the loop, its write beside it: 2% of
# the loop's time), at least MIN_CHECKPOINT_SECONDS and at most CHECKPOINT_SECONDS apart, and in any case never
# while the last is being written nor more often than keeps the copies within 4% of the loop's time
# (worker/loops/checkpoint_cadence.py). A provider that leaves costs the steps since the last checkpoint: half the
# interval on average, so for the MNIST-sized MLP (2.4 MB of state, 1-4 ms a checkpoint) a kill every 20 s loses
# ~0.25 s instead of ~5 s at 10 s (Young's optimum sqrt(2 x cost x mean time between failures) is 0.3-0.4 s
# there; docs/reports/benchmarks.md, 2026-11-29).
MIN_CHECKPOINT_SECONDS = 0.5
# A loop that exchanges values (a resident replica) checkpoints at a synchronisation, when its parameters equal
# the global model it carries (stored once: worker/loops/checkpoint_aliases.py, and once for all replicas:
# worker/loops/shared_checkpoint.py), about this often (in rounds agreed by the graph's loops:
# worker/loops/sync_cadence.py) unless steps are asked for: its state (parameters, optimizer moments, residuals, the
# global model) is many times what a round exchanges, so a 10 s or 1000-step cadence would send more checkpoint than
# pseudo-gradient up the provider's link; the agreed rounds keep a checkpoint within a quarter of what the rounds
# between two send (sync_cadence.BYTES_SHARE), whatever these seconds. A replica killed before its first checkpoint
# restarts from the fit's start, and the others wait for it at every round: at 60 s, replicas killed about once a
# minute never got past the first (a resident DiLoCo(3) fit was dead-lettered, issue 43), so 2 s, where the bytes'
# floor rules on slow links (docs/reports/benchmarks.md, 2026-11-29). A round longer than the loop's checkpoint
# interval is also checkpointed within, after an inner step (sync_cadence.within_round_due): with rounds of 42 s
# a replica's checkpoint was otherwise a round or more behind it (docs/reports/wan_lab.md, 2026-11-29).
RESIDENT_CHECKPOINT_SECONDS = 2.0


class LoopAbandoned(Exception):
    """The loop's graph stopped running (failed elsewhere, or flushed): stop the loop."""


class InitialValuesGone(Exception):
    """A loop with no checkpoint found the initial values a checkpoint released gone: it completed elsewhere (its
    checkpoint dropped then) or the graph was flushed."""


class LoopHandedBack(Exception):
    """The worker is stopping: the loop was checkpointed after `steps` steps, for another worker to go on."""

    def __init__(self, steps: int) -> None:
        super().__init__(f"handed back after {steps} steps")
        self.steps = steps


def state_bytes(values: Sequence[Any]) -> int:
    """The bytes of a loop's carried values (tensors; anything else counts 0)."""
    return sum(getattr(v, "nbytes", 0) for v in values)


def checkpoint_tensor_key(keys: GraphKeys, subgraph_id: Union[int, str], step: int, k: int) -> str:
    return f"{keys.checkpoint(subgraph_id)}:{step}:{k}"


def checkpoint_keys(keys: GraphKeys, subgraph_id: Union[int, str], step: int, n: int) -> list[str]:
    """Every Redis key the `n` tensors of the checkpoint taken at `step` may occupy (values and chunks)."""
    return [key for k in range(n) for key in stored.keys_of(checkpoint_tensor_key(keys, subgraph_id, step, k))]


def drop_checkpoint(client: Client, keys: GraphKeys, subgraph_id: int) -> None:
    """Delete a loop's published checkpoint: its hash and the tensors it names. Found from that record, not a
    SCAN, which a worker's ACL user may not run (ravop.store.access); the chunks of one a worker died writing
    before publishing it went when the loop resumed (`_drop_unpublished`)."""
    prefix = keys.checkpoint(subgraph_id)
    step, n, shared = client.hmget(prefix, "step", "n", "shared")
    doomed = [prefix, keys.checkpoint_writing(subgraph_id)]
    if step is not None and n is not None:
        doomed += checkpoint_keys(keys, subgraph_id, int(step), int(n))
    client.delete(*doomed)
    if step is not None and n is not None:
        try:
            shared = shared_checkpoint.decode(shared, int(n))
        except ValueError:   # a damaged record: its values stay until the graph is flushed
            return
        shared_checkpoint.release(client, keys, shared, shared_checkpoint.holder(subgraph_id, int(step)))


def _watcher(spec: LoopSpec, template: StepTemplate, max_bytes: int, budget: Optional[int]) -> memory.Watcher:
    """A template's memory rules: its declared sizes checked as a subgraph's are (`PlanError` naming the op past
    the limit), and each output against its declared size and the budget as it is made."""
    defined = [*spec.outer_ids, *template.hole_ids()]
    program = check_nodes(template.nodes, defined, template.results(), max_bytes)
    return memory.Watcher(program, budget)


def check_loop_program(program: Program) -> Node:
    """The loop step of a checked subgraph; `PlanError` unless it is fills (ops that read nothing, made here for
    the loop: compiler/partition.py), one loop op and tuple_gets of it, and its outputs are those tuple_gets."""
    steps = program.steps
    at = 0
    while at < len(steps) and not steps[at].inputs and steps[at].op not in LOOPS:
        at += 1
    if at == len(steps) or steps[at].op not in LOOPS:
        raise PlanError("a loop subgraph must start with its loop op (after the fills it reads, ops that read "
                        "nothing)", steps[at] if at < len(steps) else None)
    loop_step = steps[at]
    for step in steps[at + 1:]:
        if step.op not in PROJECTIONS or list(step.inputs) != [loop_step.id]:
            raise PlanError(f"a loop subgraph holds only its loop op and tuple_gets of it, not {step.op!r}", step)
    projected = {step.id for step in steps[at + 1:]}
    for output in program.outputs:
        if output not in projected:
            raise PlanError(f"a loop subgraph's outputs are tuple_gets of its loop op, not node {output}",
                            next((step for step in steps if step.id == output), None))
    return loop_step


def superseded_inputs(spec: LoopSpec, loop_step: Node) -> list[int]:
    """The loop op's inputs that only give the initial values of what it carries: read at no other position of the
    loop op and by no template, so that a loop resumed from a checkpoint never needs them (released from the store
    once the first checkpoint is published, `_Writer._commit`)."""
    inputs = list(loop_step.inputs)
    read = {i for t in spec.templates for node in t.nodes for i in node.inputs} | \
        {i for t in spec.templates for i in (*t.outer_reads(), *(f.source for f in t.seed_followers))}
    others = set(inputs[spec.n_carried:])
    return sorted({i for i, outer in zip(inputs[:spec.n_carried], spec.outer_ids) if i not in others and
                   outer not in read and outer not in spec.outer_ids[spec.n_carried:]})


def loop_inputs(program: Program, loop_step: Node, inputs: Dict[int, Any], seed: int, device: Any,
                max_bytes: Optional[int] = None, budget: Optional[int] = None) -> list[Any]:
    """The loop op's input values: the subgraph's `inputs`, and the fills ahead of the loop op made here with the
    runner (the same kernels, seeds and bits as in a subgraph of their own, without its hop and upload), each
    checked against its declared size and the budget as any subgraph's output is. An initial value its first
    checkpoint released (`superseded_inputs`) is None: the loop resumes from the checkpoint."""
    fills = program.steps[:program.steps.index(loop_step)]
    if fills:
        ids = [step.id for step in fills]
        watcher = None if max_bytes is None else memory.Watcher(check_nodes(fills, (), ids, max_bytes), budget)
        inputs = {**inputs, **run_nodes(fills, {}, seed, str(device), ids, watcher)}
    return [inputs.get(i) for i in loop_step.inputs]


class _Writer:
    """Collects what the steps persist and writes it, with progress and checkpoints, as the loop goes."""
    pending: Dict[int, Any]
    last: Optional[Tuple[int, Sequence[Any]]]
    work_waiting: Optional[Callable[[], bool]]
    exchange: Optional[StoreExchange]
    sync_end: Optional[int]
    sync_first: Optional[int]
    sync_index: Optional[int]
    # an Optional[SyncCadence]: the writes `checkpoint_at_syncs` and `_at_sync` queue read it in lambdas, run once
    # it is set, where mypy cannot narrow it
    cadence: Any
    shared: Dict[int, str]
    names: Optional[list[str]]
    cache: Optional[TensorCache]
    turns: Optional[Turns]

    def __init__(self, client: Client, keys: GraphKeys, subgraph_id: int, first_ids: Sequence[Sequence[int]],
                 checkpoint_steps: int, checkpoint_seconds: Optional[float], n_steps: int,
                 resumed_at: Optional[int] = None, stop: Optional[threading.Event] = None,
                 graph: Optional[GraphWatch] = None, segments: Optional[Any] = None,
                 metrics: Optional[WorkerMetrics] = None, resumed_shared: Optional[Dict[int, str]] = None,
                 in_loop: bool = False) -> None:
        self.client, self.keys, self.subgraph_id = client, keys, subgraph_id
        self.metrics = metrics    # the worker's WorkerMetrics: the bytes each write stores are counted, or None
        self.first_ids = first_ids
        # checkpoint_seconds None: adaptive, the interval set from each checkpoint's cost (under verify='spot' each
        # checkpoint ends a segment that may be re-run, so there it stays CHECKPOINT_SECONDS)
        self.adaptive = checkpoint_seconds is None and segments is None
        self.checkpoint_steps = checkpoint_steps
        self.checkpoint_seconds = CHECKPOINT_SECONDS if checkpoint_seconds is None else checkpoint_seconds
        self.n_steps, self.stop, self.graph = n_steps, stop, graph   # graph: its GraphWatch, or None
        self.pending = {}
        now = time.monotonic()
        self.last_flush = self.last_checkpoint = now
        self.flush_every = FLUSH_SECONDS
        self.checkpointed = resumed_at or 0
        # when periodic checkpoints are due: by their cost, and one in flight at a time, written from one host copy
        # or, `in_loop` (a store about as fast as the copy), in the loop's thread from its own tensors
        self.timing = CheckpointCadence(self.checkpoint_seconds, self.adaptive, MIN_CHECKPOINT_SECONDS,
                                        in_loop=in_loop)
        self.buffer = CheckpointBuffer()
        self.saved = resumed_at   # the step of the checkpoint in Redis (None: none)
        self.last = None          # (steps done, carried values) after the last step run here
        self.work_waiting = None  # () -> whether to give the worker up while waiting (worker/loops/hand_back.py)
        # verify='spot' (worker/verify/spot_loop.py): each checkpoint ends a segment that may be checked, so checkpoints
        # stay until the loop completes, persisted values are overwritten (a rewound loop's honest rerun replaces
        # what a liar wrote) and every write first makes sure this worker still runs the loop
        self.segments = segments
        self.exchange = None   # the loop's StoreExchange: its sends are in the store before a checkpoint (one past
        #                        a step whose values were lost would never send them again), and the values read
        #                        before a checkpoint are released after it
        self.taken = resumed_at   # the step of the last checkpoint taken (written, or queued to be)
        # flushes and checkpoints are written beside the loop, in order (under verify='spot' each write first
        # checks this worker still runs the loop, so they stay in the loop's thread)
        self.writes = BackgroundWrites() if segments is None else None
        self.sync_end = None   # a resident replica's last sync template: periodic checkpoints wait for it
        self.sync_first = self.sync_index = None   # its first sync template, and the synchronisation it is at
        self.syncs: frozenset[int] = frozenset()   # its sync templates (a checkpoint within a round is after none)
        self.round_began = now                     # when its round began (its last sync, or its start here)
        self.late: Optional[LateRounds] = None     # whether its round closed without it (DiLoCo's close_after)
        self.cadence = None    # its periodic checkpoints' SyncCadence (worker/loops/sync_cadence.py)
        self.shared = resumed_shared or {}   # the checkpoint in Redis's values shared with other loops' (by digest)
        self.names = None      # the keys of that checkpoint's values
        self.cache = None      # the worker's TensorCache: a loop handed back to take turns keeps its values there
        self.turns = None      # its Turns (worker/loops/turns.py) when it yields to other tokens' waiting work
        self.superseded: list[int] = []   # inputs to release once a checkpoint is published (`superseded_inputs`)
        # LoopRun.fence where a checkpoint may read the carried values beside the loop (a CPU loop that exchanges
        # nothing, not spot-checked): the next step's in-place updates wait for it (worker/loops/checkpoint_cadence.py)
        self.fence: Optional[Callable[[Callable[[], None]], None]] = None
        self.step_at: Optional[float] = None   # when the last step ended, and how long it took
        self.step_seconds = 0.0

    def checkpoint_at_syncs(self, sync_templates: Sequence[int], checkpoint_steps: int,
                            checkpoint_seconds: float) -> None:
        """A loop that exchanges values: periodic checkpoints every `checkpoint_steps` (0: by time only) or
        at the synchronisations the graph's loops agreed on for `checkpoint_seconds` (worker/loops/sync_cadence.py),
        taken once the synchronisation due next has run."""
        self.checkpoint_steps = checkpoint_steps
        self.sync_end = sync_templates[-1] if sync_templates else None
        self.sync_first = sync_templates[0] if sync_templates else None
        self.syncs = frozenset(sync_templates)
        self.cadence = SyncCadence(checkpoint_seconds, time.monotonic())
        if self.cadence.rounds is None:   # a loop resumed elsewhere falls in with the others at once
            self._queue(lambda: self.cadence.agreed(agreed(self.client, self.keys)))

    def on_wait(self, state: Optional[bytes]) -> None:
        """Called while the loop waits for a value another loop sends: stop if the graph stopped running, hand
        the loop back (after a checkpoint of what it has) if the worker is stopping or `work_waiting()` says to
        (the replica it waits for may be queued behind it with no idle worker to take it: worker/loops/hand_back.py)."""
        if state != graph_states.RUNNING.encode():
            raise LoopAbandoned(state)
        if (self.stop is not None and self.stop.is_set()) or (self.work_waiting is not None and self.work_waiting()):
            if self.last is None:
                raise LoopHandedBack(self.saved or 0)
            self.write(*self.last)
            if self.cache is not None and self.segments is None and not (self.stop is not None and self.stop.is_set()):
                done, carried = self.last   # taking turns: this worker may take the replica back
                held_values.keep(self.cache, self.names or [checkpoint_tensor_key(self.keys, self.subgraph_id, done,
                                                                                  k) for k in range(len(carried))],
                                 carried)
            raise LoopHandedBack(self.last[0])

    def on_step(self, done: int, template: int, run: int, outputs: Sequence[Any], carried: Sequence[Any]) -> None:
        if self.graph is not None and self.graph.ended is not None:   # cancelled or failed: stop now
            raise LoopAbandoned(self.graph.ended)
        if self.writes is not None:
            self.writes.check()   # a write that failed beside the loop (or found the graph stopped) stops it
        if self.turns is not None and self.turns.due and done < self.n_steps:   # another token's turn
            self.write(done, carried)
            raise LoopHandedBack(done)
        self.last = (done, carried)
        for first, value in zip(self.first_ids[template], outputs):
            self.pending[first + run] = value
        if self.late is not None:
            skip_to = self.late.skip_to(done)
            if skip_to is not None:
                raise RoundClosed(skip_to, list(carried))
        now = time.monotonic()
        if self.step_at is not None:
            self.step_seconds = now - self.step_at
        self.step_at = now
        if self.stop is not None and self.stop.is_set() and done < self.n_steps:
            self.write(done, carried)
            raise LoopHandedBack(done)
        asked = bool(self.checkpoint_steps and done - self.checkpointed >= self.checkpoint_steps)
        if self.cadence is not None and template in (self.sync_first, self.sync_end):
            asked = self._at_sync(template, run, now, carried) or asked
        due = self.timing.due(asked, self.last_checkpoint if self.cadence is None else None, now)
        if due and self.sync_end in (None, template) or self.cadence is not None and template not in self.syncs \
                and within_round_due(self.timing, now, self.round_began, self.last_checkpoint):
            self._checkpoint(done, carried)
        elif now - self.last_flush >= self.flush_every and not (self.writes is not None and self.writes.busy()):
            self.write(done, wait=False)

    def _at_sync(self, template: int, run: int, now: float, carried: Sequence[Any]) -> bool:
        """Whether the periodic checkpoint is due after this sync template; proposes the graph's cadence when this
        loop's clock is due first (beside the loop, as the writes are)."""
        if template == self.sync_first:
            self.sync_index = run + 1   # its runs count the synchronisations from the fit's start, resumed or not
        if template == self.sync_end:
            self.round_began = now
        if template != self.sync_end or self.sync_index is None:   # (replica 0's update sent before the first step)
            return False
        sent = self.exchange.sent_bytes if self.exchange is not None else 0
        due, rounds = self.cadence.at_sync(self.sync_index, now, state_bytes(carried), sent)
        if rounds is not None:
            self._queue(lambda: self.cadence.agreed(agree(self.client, self.keys, rounds)))
        return due

    def _queue(self, write: Callable[[], object]) -> None:
        """`write()` beside the loop, in order with the writes (in the loop's thread under verify='spot')."""
        if self.writes is not None:
            self.writes.put(write)
        else:
            write()

    def write(self, done: int, carried: Optional[Sequence[Any]] = None, record: Optional[Dict[str, Any]] = None,
              wait: bool = True) -> None:
        """Persisted values, progress, and a checkpoint of `carried` if given, in one transaction, after the writes
        queued before it; `record`: fields to set on the graph's meta with them. `wait=False`: written beside the
        loop (what it writes is taken now, the checkpoint into the host buffer: the loop may update its tensors in
        place afterwards; none is taken while the last is in flight, `self.timing.due`)."""
        if self.writes is not None and not wait:
            self.writes.put(functools.partial(self._commit, *self._take(done, carried, record, copy=True)))
            return
        self.drain()
        self._commit(*self._take(done, carried, record, copy=False))

    def _checkpoint(self, done: int, carried: Sequence[Any]) -> None:
        """A periodic checkpoint of `carried`: with a fence, written beside the loop from its own tensors or from
        the host buffer filled beside it (`timing.from_live`), the next step's in-place updates waiting for what
        reads them; else in the loop's thread (`timing.in_loop`) or from the buffer filled in it."""
        writes = self.writes
        if self.fence is None or writes is None:
            self.write(done, carried, wait=self.timing.in_loop)
            return
        live = self.timing.from_live(state_bytes(carried), self.step_seconds)
        done, pending, host, record, reads = self._take(done, carried, None, copy=False, fenced=True)
        released = threading.Event()   # the loop's tensors are no longer read

        def write() -> None:
            try:
                held = host
                if held is not None and not live:
                    held = self.buffer.fill(held)
                    released.set()
                self._commit(done, pending, held, record, reads)
            finally:
                released.set()

        def wait() -> None:
            began = time.monotonic()
            while not released.wait(0.1):   # a write after a failed one never runs: the loop hears of the
                if writes.failed:            # failure at its next step
                    break
            self.timing.waited(time.monotonic() - began, self.step_seconds)
        if host is not None:
            self.fence(wait)
        writes.put(write)

    def _take(self, done: int, carried: Optional[Sequence[Any]], record: Optional[Dict[str, Any]],
              copy: bool, fenced: bool = False) -> "_Taken":
        """(done, persisted values, host copies of the carried values (`copy`: in the host buffer) or None,
        record, exchanged keys read so far) for `_commit`; a checkpoint is taken once per step. `fenced`: read
        beside the loop up to a fence (`_checkpoint`)."""
        pending, self.pending = self.pending, {}
        host = reads = None
        if carried is not None and done != self.taken:
            began = time.monotonic()
            host = self.buffer.fill(carried) if copy else [devices.to_host(value) for value in carried]
            self.timing.taken(time.monotonic() - began, fenced)
            reads = self.exchange.take_reads() if self.exchange is not None else None
            self.taken, self.checkpointed, self.last_checkpoint = done, done, time.monotonic()
            if self.cadence is not None:
                self.cadence.taken(self.sync_index, self.last_checkpoint)
        return done, pending, host, record, reads

    def _commit(self, done: int, pending: Dict[int, Any], host: Optional[list[Any]], record: Optional[Dict[str, Any]],
                reads: Optional[list[tuple[str, str]]]) -> None:
        keys, client = self.keys, self.client
        began = time.monotonic()
        if self.segments is not None:
            self.segments.guard()
        if host is not None and self.exchange is not None:
            self.exchange.flush()
        # spot checks re-run segments from their checkpoints' tensors by key: those stay whole
        same = checkpoint_aliases.aliases(host) if host is not None and self.segments is None else {}
        # a loop that exchanges values stores its values by digest, once for all the loops' checkpoints
        shared = shared_checkpoint.choose(host, same) \
            if host is not None and self.segments is None and self.exchange is not None else {}
        total = sum(t.nbytes for t in host) if host is not None else 0
        size = stored.fit_to_server(client, total, "a loop checkpoint", keys.meta) \
            if total > stored.chunk_bytes() else None
        # the values other replicas upload are waited for, those this one claims go with its transaction
        shared_checkpoint.settle(client, keys, host, shared, shared_checkpoint.holder(self.subgraph_id, done))
        while True:
            try:
                state = self._transaction(done, pending, host, record, same, shared, size)
                break
            except redis.WatchError:   # a shared value it found was deleted meanwhile: look again
                continue
        if host is not None:
            if self.segments is not None:
                self.segments.on_checkpoint(self.saved or 0, done, host)
            elif self.saved is not None:
                shared_checkpoint.release(client, keys, self.shared,
                                          shared_checkpoint.holder(self.subgraph_id, self.saved))
            self.saved, self.shared = done, shared
            self.names = [shared_checkpoint.value_key(keys, shared[k]) if k in shared else
                          checkpoint_tensor_key(keys, self.subgraph_id, done, k) for k in range(len(host))]
            if self.exchange is not None:
                self.exchange.release(reads)   # exchanged values read before it are no longer needed here
            if self.superseded:   # the initial values: a resumed loop reads this checkpoint instead
                scripts.release_superseded(client, keys, self.subgraph_id, self.superseded)
                self.superseded = []
            self.timing.written(time.monotonic() - began, total)   # the host buffer may be refilled from here on
        self.last_flush = time.monotonic()
        if host is None:
            self.flush_every = max(FLUSH_SECONDS, FLUSH_SPACING * (self.last_flush - began))
        if state != graph_states.RUNNING.encode():
            raise LoopAbandoned(state)

    def drain(self) -> None:
        """Wait for the writes queued beside the loop; raises the first that failed."""
        if self.writes is not None:
            self.writes.drain()

    def _transaction(self, done: int, pending: Dict[int, Any], host: Optional[list[Any]],
                     record: Optional[Dict[str, Any]], same: Dict[int, int], shared: Dict[int, str],
                     size: Optional[int]) -> Optional[bytes]:
        """Write persisted values, progress and the checkpoint of `host` (if given) in one transaction; the
        graph's state. WatchError if a shared value it found in the store was deleted before it was written."""
        keys, client = self.keys, self.client
        with client.pipeline(transaction=True) as pipe:
            present = shared_checkpoint.watch_present(pipe, client, keys, shared)
            if shared:
                pipe.multi()
            values = [devices.to_host(value) for value in pending.values()]
            sets = value_writes.queue_values(pipe, [keys.tensor(i) for i in pending], encode_tensors(values),
                                             only_new=self.segments is None)
            pipe.hset(keys.steps, self.subgraph_id, done)
            written = 0
            if host is not None:
                chunks = client.pipeline(transaction=False)   # big tensors' chunks, before the transaction
                if size is not None:   # chunks written before their transaction: a resumed loop deletes them if
                    chunks.set(keys.checkpoint_writing(self.subgraph_id), done)   # this worker dies before it
                    pipe.delete(keys.checkpoint_writing(self.subgraph_id))
                for k, value in enumerate(host):
                    if k not in same and k not in shared:
                        stored.write(pipe, checkpoint_tensor_key(keys, self.subgraph_id, done, k), value, size,
                                     chunks)
                        written += value.nbytes
                shared_checkpoint.write(pipe, chunks, keys, host, shared, present,
                                        shared_checkpoint.holder(self.subgraph_id, done), size)
                chunks.execute()
                # the checkpoint it replaces, whose references are released next (by a resumed loop, if this
                # worker dies first)
                replaced = self.shared if self.saved is not None else {}
                pipe.hset(keys.checkpoint(self.subgraph_id),
                          mapping={"step": done, "n": len(host), "same": checkpoint_aliases.encode(same),
                                   "shared": shared_checkpoint.encode(shared),
                                   "replaces": self.saved if replaced else "",
                                   "replaced": shared_checkpoint.encode(replaced),
                                   # what this worker's checkpoint copies cost the loop so far (benchmarks)
                                   "copied": f"{self.timing.copied:.4f}"})
                if self.saved is not None and self.saved != done and self.segments is None:
                    # the replaced checkpoint's own tensors go as this one is published: one checkpoint at rest
                    # (under verify='spot' they stay: a segment may be re-run from them)
                    doomed = [key for k in range(len(host)) if k not in self.shared for key in
                              stored.keys_of(checkpoint_tensor_key(keys, self.subgraph_id, self.saved, k))]
                    if doomed:
                        pipe.delete(*doomed)
            if record:
                pipe.hset(keys.meta, mapping=record)
            pipe.hget(keys.meta, "state")
            replies = pipe.execute()
        if self.metrics is not None:   # the persisted values the server did not have yet, and the checkpoint
            new = [flag for reply in replies[:sets] for flag in reply]
            self.metrics.written_bytes(written + sum(value.nbytes for value, flag in zip(values, new) if flag))
        return replies[-1]

    def close(self) -> None:
        if self.writes is not None:
            self.writes.close()
        if self.late is not None:
            self.late.stop()


def checkpoint_record(keys: Any, subgraph_id: Any,
                      saved: Dict[bytes, bytes]) -> Tuple[int, int, Dict, Dict, Dict[int, str]]:
    """(step, n, same, shared, {k: key} of the tensors to read) of a checkpoint record (its hash, non-empty): a value
    aliased to an earlier one (`same`) is not read, a shared one is read under its digest's key; `PlanError` if the
    record is malformed."""
    try:
        step, n = int(saved[b"step"]), int(saved[b"n"])
        same = checkpoint_aliases.decode(saved.get(b"same"), n)
        shared = shared_checkpoint.decode(saved.get(b"shared"), n)
    except (KeyError, ValueError) as exc:
        raise PlanError(f"the checkpoint of loop subgraph {subgraph_id} is malformed: {exc}") from None
    names = {k: shared_checkpoint.value_key(keys, shared[k]) if k in shared else
             checkpoint_tensor_key(keys, subgraph_id, step, k) for k in range(n) if k not in same}
    return step, n, same, shared, names


def _resume(client: Client, keys: GraphKeys, subgraph_id: int, n_carried: int, device: Any,
            cache: Optional[TensorCache] = None, saved: Optional[Dict[bytes, bytes]] = None,
            prefetched: Optional[Dict[str, Optional[bytes]]] = None, writing: Optional[bytes] = None
            ) -> Tuple[Optional[int], Optional[list[Any]], Dict[int, str]]:
    """(step, carried values, {k: digest} of those shared with other loops' checkpoints) of the loop's
    checkpoint, or (None, None, {}) without a usable one; its tensors from `cache` where this worker kept them
    when it handed the loop back (worker/loops/held_values.py), else from `prefetched` ({key: bytes}) or the store
    in one round trip. The references of the checkpoint it replaced are released (again: a worker may have died
    before it did), and the chunks of one a worker died writing are deleted. `saved`: its record, where the worker
    read it already (worker/loops/loop_start.py), with `writing` (the step of a checkpoint going up, or None)."""
    if saved is None:
        saved, writing = client.pipeline(transaction=False).hgetall(keys.checkpoint(subgraph_id)).get(
            keys.checkpoint_writing(subgraph_id)).execute()
    if writing is not None and writing != saved.get(b"step"):
        _drop_unpublished(client, keys, subgraph_id, n_carried, writing)
    if not saved:
        return None, None, {}
    step, n, same, shared, names = checkpoint_record(keys, subgraph_id, saved)
    try:
        replaced = shared_checkpoint.decode(saved.get(b"replaced"), n)
        if replaced:
            shared_checkpoint.release(client, keys, replaced,
                                      shared_checkpoint.holder(subgraph_id, int(saved[b"replaces"])))
    except (KeyError, ValueError) as exc:
        raise PlanError(f"the checkpoint of loop subgraph {subgraph_id} is malformed: {exc}") from None
    if n != n_carried:
        raise PlanError(f"the checkpoint of loop subgraph {subgraph_id} holds {n} values, the loop carries "
                        f"{n_carried}")
    read = held_values.read(client, cache, names, prefetched)
    where = f"the checkpoint of loop subgraph {subgraph_id} at step {step}"
    for k in shared:
        if read.get(k) is not None:
            shared_checkpoint.check(read[k], shared[k], where)
    carried = [read.get(k) for k in range(n)]
    for k, j in same.items():
        carried[k] = None if carried[j] is None else carried[j].clone()
    if any(value is None for value in carried):
        raise PlanError(f"{where} lost a tensor")
    return step, [devices.to_device(value, device) for value in carried], shared


def _drop_unpublished(client: Client, keys: GraphKeys, subgraph_id: int, n: int, writing: bytes) -> None:
    """Delete the chunks of the checkpoint at step `writing` a worker died writing (before its transaction published
    it), so that the store holds one checkpoint at rest besides the one being written."""
    client.delete(*checkpoint_keys(keys, subgraph_id, int(writing), n), keys.checkpoint_writing(subgraph_id))


def unpaced(on_step: OnStep, loop: Any, values: Any, exchange: Optional[StoreExchange]
            ) -> Tuple[OnStep, Optional[StoreExchange]]:
    """The steps' hooks as they are: `LoopContext.pace_steps` unless a benchmark installed pacing."""
    return on_step, exchange


@dataclass
class LoopContext:
    """What `run_loop` runs and with which of the worker's rules: one per loop subgraph the worker claims
    (worker/serve/consumer.py builds it)."""
    client: Any                 # the worker's Redis client
    keys: Any                   # the graph's ravop.store.GraphKeys
    subgraph_id: Any
    subgraph: Any               # the plan_pb2 subgraph, its `loop` set
    program: Any                # its checked program (worker/execute/validate.py)
    inputs: Dict[int, Any]      # its input tensors by id, on the worker's device
    seed: int
    device: Any
    checkpoint_steps: Optional[int] = None   # a checkpoint every ... steps (None: CHECKPOINT_STEPS); a loop that
    #                                          exchanges values: at a synchronisation, when given
    checkpoint_seconds: Optional[float] = None   # ... or seconds, whichever comes first (None: by their cost)
    resident_checkpoint_seconds: float = RESIDENT_CHECKPOINT_SECONDS   # a loop that exchanges values: this often
    max_bytes: Optional[int] = None   # the worker's memory rules for the templates (None: unchecked) ...
    budget: Optional[int] = None      # ... and its memory budget
    stop: Any = None            # a threading.Event set when the worker is stopping (then LoopHandedBack after a
    #                             checkpoint)
    work_waiting: Optional[Callable[[], bool]] = None   # whether a loop waiting for another loop's values hands
    #                                                     itself back (worker/loops/hand_back.py)
    segments: Any = None        # verify='spot''s segment checks (worker/verify/spot_loop.py), or None
    cache: Any = None           # the worker's TensorCache, where a loop handed back to take turns keeps its values
    #                             for this worker to resume it from (worker/loops/held_values.py)
    metrics: Any = None         # the worker's WorkerMetrics: the bytes the loop's writes store
    loop_start: Any = None      # what the worker read for the loop with its inputs (worker.loops.loop_start
    #                             .LoopStart), or None: read here
    pace_steps: Callable = unpaced   # (on_step, LoopSpec, values, exchange) -> (on_step, exchange) the loop runs
    #                                  with: benchmarks' pacing (worker/execute/emulated_device.py) when installed
    turns: Any = None           # its token's worker time charged as it runs, and when it yields to another token's
    #                             waiting work (worker/loops/turns.py), or None
    store_bytes_per_s: float = 0.0   # the rate the worker measured for its store at start: at least
    #                                  checkpoint_cadence.IN_LOOP_BYTES_PER_S, checkpoints are written in the loop's
    #                                  thread from its own tensors (no host copy)
    release_inputs: bool = False   # release the initial values of what it carries at its first checkpoint: not
    #                                under verify='spot' (a segment re-run from the start reads them) nor verify=k
    #                                (another copy may start from them); the loop then updates them in place, so
    #                                `inputs` must hold them uncached (worker/serve/consumer.py `_inputs`)


def run_loop(ctx: "LoopContext") -> Dict[int, Any]:
    """{output id: tensor} of the loop subgraph of `ctx` (a LoopContext); resumes from its checkpoint if an earlier
    run left one."""
    loop_start, segments, stop = ctx.loop_start, ctx.segments, ctx.stop
    program, subgraph_id = ctx.program, ctx.subgraph_id
    loop_step = check_loop_program(program)
    spec = unpack_loop(ctx.subgraph.loop)   # decoded once: the templates' nodes serve the checks and the runner
    max_bytes = ctx.max_bytes
    watch = None if max_bytes is None else (lambda template: _watcher(spec, template, max_bytes, ctx.budget))
    meta = loop_start.meta if loop_start is not None else None   # None: each reader reads its own
    start, carried, shared = _resume(ctx.client, ctx.keys, subgraph_id, spec.n_carried, ctx.device, ctx.cache,
                                     loop_start.checkpoint if loop_start is not None else None,
                                     loop_start.prefetched if loop_start is not None else None,
                                     loop_start.writing if loop_start is not None else None)
    first_ids = [[o.first_id for o in t.outputs if o.first_id is not None] for t in spec.templates]
    if any(len(ids) != len(t.outputs) for ids, t in zip(first_ids, spec.templates)):
        raise PlanError("a loop step's persisted values and their tensor ids do not pair up")
    graph = GraphWatch(ctx.client, ctx.keys)
    store_exchange = None
    writer = _Writer(ctx.client, ctx.keys, subgraph_id, first_ids,
                     CHECKPOINT_STEPS if ctx.checkpoint_steps is None else ctx.checkpoint_steps,
                     ctx.checkpoint_seconds, spec.n_steps, start, stop, graph, segments, ctx.metrics, shared,
                     ctx.store_bytes_per_s >= IN_LOOP_BYTES_PER_S)
    try:
        values = loop_inputs(program, loop_step, ctx.inputs, ctx.seed, ctx.device, ctx.max_bytes, ctx.budget)
        if carried is None and any(value is None for value in values):
            raise InitialValuesGone(f"loop subgraph {subgraph_id} has no checkpoint to resume from, and the initial "
                                    "values its first checkpoint released are gone")
        # the released initial values' places hold the resumed ones (what reads their shapes: a benchmark's pacing)
        values = [carried[k] if value is None and carried is not None and k < spec.n_carried else value
                  for k, value in enumerate(values)]
        # the initial values it releases are the loop's own (the worker did not cache them): updated in place
        # rather than copied first
        superseded = superseded_inputs(spec, loop_step) if ctx.release_inputs else []
        writer.superseded = superseded
        writer.timing.expect(state_bytes(values[:spec.n_carried]), ctx.store_bytes_per_s)
        donated = [k for k, i in enumerate(loop_step.inputs[:spec.n_carried]) if i in superseded]
        runner = LoopRun(spec, values, ctx.seed, ctx.device, watch, step_decisions.for_device(ctx.device), donated)
        if segments is not None:
            segments.instrument(runner)
        writer.work_waiting, writer.cache = ctx.work_waiting, ctx.cache
        store_exchange = writer.exchange = \
            StoreExchange(ctx.client, ctx.keys, ctx.device, writer.on_wait, _leaving(stop, ctx.work_waiting), meta) \
            if runner.exchanges() else None
        if store_exchange is not None:
            writer.checkpoint_at_syncs(list(spec.sync_templates), ctx.checkpoint_steps or 0,
                                       ctx.resident_checkpoint_seconds)
            channel = droppable(spec.templates, spec.sync_templates, spec.close_after_s)
            if channel is not None:
                writer.late = LateRounds.of(ctx.client, lambda run: ctx.keys.exchange(mark(channel), run),
                                            spec.positions(), spec.sync_templates[0], spec.sync_templates[-1],
                                            spec.first_step)
        if store_exchange is None and segments is None and str(ctx.device).startswith("cpu"):
            writer.fence = runner.fence   # (a GPU's checkpoint is a copy to the host already, made in the loop)
        on_step, exchange = ctx.pace_steps(writer.on_step, spec, values, store_exchange)
        graph.start(meta)
        if ctx.turns is not None:
            ctx.turns.start()   # time charged for every loop; yielding only for one that neither exchanges nor is
            if segments is None and store_exchange is None:   # spot-checked (its replicas or segments wait on it)
                writer.turns = ctx.turns
        with heap_hold.held():   # what a step frees stays for the next: no page faults for it again
            carried = run_steps(runner, carried, start or 0, on_step, exchange,
                                graph.stop_requested if runner.stoppable() else None)
        # the last flush and the exchange's last sends (a round trip each over a slow link) are written beside
        # each other, and both are in the store before the loop is done; with no exchange the loop waits for the
        # flush anyway, so it writes it itself (handing it to the writes' thread cost a short loop a thread start
        # and two thread switches, ~0.5 ms)
        if runner.stopped_at is None and segments is None:
            writer.write(spec.n_steps, wait=store_exchange is None)
        if store_exchange is not None:
            store_exchange.flush()
        if runner.stopped_at is None:
            if segments is None:
                writer.drain()
            else:
                writer.write(spec.n_steps, carried)
        else:   # a checkpoint at the stop: under verify='spot' it also ends the last segment to check
            writer.write(runner.stopped_at[0], carried,   # the loop's own decision (Step.stop_if), or a request
                         stopped_record(spec, *runner.stopped_at, runner.stop_reason or graph.stop_reason))
        if segments is not None:
            segments.wait_settled()
        if loop_start is not None:   # its record as written: the worker's metrics need not read it back
            loop_start.ended = (runner.stopped_at[0] if runner.stopped_at is not None else spec.n_steps,
                                writer.saved)
        projections = program.steps[program.steps.index(loop_step) + 1:]
        env = run_nodes(projections, {loop_step.id: tuple(carried)}, outputs=program.outputs)
    except OpError as exc:   # reported as on any subgraph: the op, its sizes, the device, and the step
        raise kernel_error(exc, ctx.device, ctx.budget or 0) from exc.__cause__
    finally:
        writer.close()
        graph.close()
        if ctx.turns is not None:
            ctx.turns.close()
        if store_exchange is not None:
            store_exchange.close()
    return {o: env[o].contiguous() for o in program.outputs}


def run_steps(runner: LoopRun, carried: Optional[list[Any]], start: int, on_step: Callable, exchange: Any,
              stop: Optional[Callable[[], bool]]) -> list[Any]:
    """`runner.run`, going on at the round's `down` each time a round closed without the loop (`RoundClosed`:
    worker/loops/late_rounds.py); a loop run from `start` with the carried values it had is the same loop."""
    while True:
        try:
            return runner.run(carried, start, on_step, exchange, stop)
        except RoundClosed as closed:
            carried, start = closed.carried, closed.start


def stopped_record(spec: LoopSpec, steps: int, rounds: int, trained: int, reason: Optional[str]) -> Dict[str, Any]:
    """The graph's meta fields saying where a stop request ended a loop after `steps` steps: `stopped` in words
    and `stopped_step`, the training steps run (`trained`: a validation step after each epoch is not one)."""
    where = f"at epoch {rounds} of {spec.rounds}" if spec.rounds > 1 else f"after step {steps} of {spec.n_steps}"
    return {"stopped": f"stopped early {where} ({reason})", "stopped_step": trained}


def _leaving(stop: Optional[threading.Event], work_waiting: Optional[Callable[[], bool]]) -> Callable[[], bool]:
    """() -> whether a waiting loop's worker is stopping or should give the loop up: what makes `on_wait` act,
    read beside the loop by its exchange (worker/loops/exchange.py) so that a receive never waits on those reads."""
    return lambda: (stop is not None and stop.is_set()) or bool(work_waiting is not None and work_waiting())
