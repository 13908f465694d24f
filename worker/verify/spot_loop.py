"""verify='spot' for training loops: a loop is checked per segment between checkpoints. The worker running it
hands in a digest of the carried values at each checkpoint (a segment "start-end:runner"); the SPOT script draws
whether another worker re-runs that segment from the checkpoint it started from and compares (same device type:
the steps are deterministic, so an honest re-run gives the same bits). Checks run while the loop goes on; the
loop completes only once every segment is settled, so its successors wait for the confirmation.

On a mismatch a third worker breaks the tie; if the loop's runner lost, the script rewinds the loop to the end of
its confirmed segments and queues it again, the runner notices at its next write and stops, and an honest worker
recomputes the rest, overwriting the persisted values (the losses) of the unconfirmed steps. The disputants and
the tie-breaker re-run the segment with per-op digests (worker/verify/dispute_trace.py), and the first step and op where
the loser parts from the winners goes to the graph's disputes (`ravop logs`).

Across numerics classes (issue 42) the bits of honest runs may differ: a re-run goes to a live worker of the
runner's class and of another user where there is one (for the first half of the settle time), and a checker of
another class votes by tolerance (worker/verify/cross_class.py). A check that stays open past the graph's
`settle_seconds` is ended by the deadline check of whoever meets it (the runner at its checkpoints and at the end,
a worker passing the re-run on): accepted unverified, or the graph fails (CheckFailed) naming the disputants."""
import logging
import re
import time
from typing import Any, Optional, Union

from ravop.core import graph_states
from ravop.core.loop_template import LoopSpec
from ravop.core.node import Node
from ravop.core.spot_policy import Verify
from ravop.runtime.loop_run import LoopRun
from ravop.store import GraphKeys, TokenKeys
from ravop.store import tensors as stored
from ravop.store import worker_info
from ravop.store import votes as store_votes
from ravop.wire import plan_pb2, unpack_loop

from ..execute import device as devices
from ..execute.validate import Program, check
from ..loops.loop_subgraph import (
    LoopAbandoned, LoopHandedBack, _watcher, check_loop_program, checkpoint_keys, checkpoint_tensor_key, loop_inputs)
from . import cross_class, redundant
from .dispute_trace import Tracer, first_difference, unpack

log = logging.getLogger("ravop.worker")
SETTLED = (b"unchecked", b"confirmed", b"unverified")
OPEN = (b"checking", b"disputed")
POLL_SECONDS = 0.05
DEADLINE_CHECK_SECONDS = 1.0   # how often the runner asks whether its open checks are past their deadline
# How long a finished loop waits for the disputants of its segments to hand in their traces: a banned worker
# that never does leaves its dispute named by segment only.
NARROW_WAIT_SECONDS = 120.0
_SEGMENT = re.compile(r"(\d+)-(\d+):([^:]+)")


def segment_id(start: int, end: int, member: str) -> str:
    return f"{start}-{end}:{member}"


def parse_segment(text: str) -> tuple[int, int, str]:
    """(start, end, runner) of a segment id; ValueError if it is not one."""
    found = _SEGMENT.fullmatch(text)
    if found is None or int(found.group(1)) >= int(found.group(2)):
        raise ValueError(f"{text!r} is not a loop segment (start-end:worker@kind)")
    return int(found.group(1)), int(found.group(2)), found.group(3)


class CheckFailed(Exception):
    """A segment's check ended by its deadline with no majority: the graph fails naming `workers`."""

    def __init__(self, text: str, workers: list[str]) -> None:
        super().__init__(text)
        self.workers = workers


class LoopSegments:
    """The running worker's side: `run_loop` (`LoopContext.segments`) calls `guard` before each write,
    `on_checkpoint` after each checkpoint, `instrument` once and `wait_settled` after the last step."""

    def __init__(self, worker: Any, keys: GraphKeys, subgraph_id: Union[int, str]) -> None:
        self.worker, self.keys, self.subgraph_id = worker, keys, subgraph_id
        self.last_end = 0
        self.next_deadline_check = 0.0
        self.confirmed: set[str] = set()

    def guard(self) -> None:
        """LoopAbandoned unless this worker still runs the loop (a lost dispute rewinds it to another)."""
        pipe = self.worker.client.pipeline(transaction=False)
        pipe.hget(self.keys.taken, self.subgraph_id)
        pipe.sismember(TokenKeys(self.keys.token).banned, self.worker.principal)
        pipe.hget(self.keys.meta, "outvoted")   # the graph's own record, until its requester bans it
        taken, banned, outvoted = pipe.execute()
        banned = banned or f",{self.worker.principal},".encode() in (outvoted or b"")
        if banned or taken != self.worker.name.encode():
            log.info("worker %s stops loop subgraph %s of graph %s: %s", self.worker.name, self.subgraph_id,
                     self.keys.graph_id, "banned" if banned else f"rewound (now {taken})")
            raise LoopAbandoned("rewound by a spot check" if not banned else "banned by a spot check")

    def on_checkpoint(self, start: int, end: int, carried: list[Any]) -> None:
        liar = self.worker.wrong_outputs
        if liar is not None:
            liar.lies()
        self.last_end = end
        log.info("worker %s: loop subgraph %s of graph %s, segment %d-%d done", self.worker.name, self.subgraph_id,
                 self.keys.graph_id, start, end)
        self.worker.spot.submit(self.keys, self.subgraph_id, redundant.digest(dict(enumerate(carried))),
                                segment_id(start, end, self.worker.spot.member))
        self.settle_open()

    def settle_open(self, segments: Optional[dict[bytes, bytes]] = None) -> None:
        """Run the deadline check of the loop's open checks (at most every DEADLINE_CHECK_SECONDS); CheckFailed
        if one ended in a dispute nobody broke."""
        if time.monotonic() < self.next_deadline_check:
            return
        self.next_deadline_check = time.monotonic() + DEADLINE_CHECK_SECONDS
        for segment, state in self.states(segments).items():
            if state in OPEN:
                reply = self.worker.spot.settle(self.keys, self.subgraph_id, segment)
                if reply[0] == "split":
                    raise CheckFailed(f"verification failed: loop segment {segment} was disputed among "
                                      f"{', '.join(reply[1:])} and no majority came within the settle time",
                                      reply[1:])

    def instrument(self, loop_run: LoopRun) -> None:
        if self.worker.wrong_outputs is not None:
            self.worker.wrong_outputs.instrument(loop_run)

    def wait_settled(self) -> None:
        """Return once every segment of the loop is confirmed or accepted unchecked (and its disputes narrowed,
        or NARROW_WAIT_SECONDS have passed); LoopAbandoned if the graph stopped or this worker lost the loop."""
        client, keys = self.worker.client, self.keys
        narrow_by: Optional[float] = None
        while True:
            self.guard()
            pipe = client.pipeline(transaction=False)
            pipe.hgetall(keys.segments(self.subgraph_id))
            pipe.hget(keys.meta, "state")
            segments, state = pipe.execute()
            if state != graph_states.RUNNING.encode():
                raise LoopAbandoned(state)
            self.settle_open(segments)
            if all(v in SETTLED for v in self.states(segments).values()):
                narrow_by = narrow_by or time.monotonic() + NARROW_WAIT_SECONDS
                if time.monotonic() > narrow_by or not self._unnarrowed(segments):
                    return
            if self.worker.stopping.is_set():
                raise LoopHandedBack(self.last_end)
            self.worker.stopping.wait(POLL_SECONDS)


    def states(self, segments: Optional[dict[bytes, bytes]] = None) -> dict[str, Optional[bytes]]:
        """The state of each of the loop's segments' checks, derived from their voters' own keys (ravop.store.votes):
        nothing a worker user writes in the segments hash settles one. A confirmed check stays confirmed, so it is
        read once."""
        if segments is None:
            segments = self.worker.client.hgetall(self.keys.segments(self.subgraph_id))
        listed = [f.decode() for f in segments if _SEGMENT.fullmatch(f.decode())]
        unknown = [s for s in listed if s not in self.confirmed]
        found = store_votes.checks(self.worker.client, self.keys, self.subgraph_id, unknown) if unknown else {}
        self.confirmed.update(str(s) for s, c in found.items() if c.state == "confirmed")
        return {s: b"confirmed" if s in self.confirmed else
                (None if found[s].state is None else str(found[s].state).encode()) for s in listed}

    def _unnarrowed(self, segments: dict[bytes, bytes]) -> list[str]:
        """The loop's settled disputes whose loser's first difference is not recorded yet (a dispute of a segment
        rewound away never settles, and is not waited for)."""
        client, keys = self.worker.client, self.keys
        unnarrowed = []
        for segment in (s for s in segments.get(b"#disputes", b"").decode().split(",") if s):
            found = store_votes.read(client, keys, self.subgraph_id, segment)   # the state derived from its voters
            if found.get(b"#state") == b"confirmed" and b"#losers" in found and b"#narrowed" not in found:
                unnarrowed.append(segment)
        return unnarrowed


def drop_segments(client: Any, keys: GraphKeys, subgraph_id: Union[int, str]) -> None:
    """Delete the checkpoints a completed spot-checked loop kept for its segments' checks."""
    n = client.hget(keys.checkpoint(subgraph_id), "n")
    steps: set[int] = set()
    for field in client.hkeys(keys.segments(subgraph_id)):
        try:
            start, end, _ = parse_segment(field.decode())
        except ValueError:
            continue
        steps.update((start, end))
    if n is not None and steps:
        client.delete(*[key for step in steps for key in checkpoint_keys(keys, subgraph_id, step, int(n))])
    if n is not None:   # the values checkers of other classes stored for their disputes (worker/verify/cross_class.py)
        for segment in (f.decode() for f in client.hkeys(keys.segments(subgraph_id))):
            if _SEGMENT.fullmatch(segment):
                cross_class.drop(client, keys, subgraph_id, segment, int(n))


class _Reached(Exception):
    def __init__(self, carried: list[Any]) -> None:
        super().__init__("segment end reached")
        self.carried = carried


def run_segment(worker: Any, keys: GraphKeys, subgraph_id: Union[int, str], subgraph: Any, program: Program,
                seed: int, start: int, end: int, tracer: Optional[Tracer] = None) -> Optional[list[Any]]:
    """The carried values after steps start..end of a loop subgraph, from the checkpoint at `start` (the loop's
    initial values at 0); None if that checkpoint is gone (the loop completed or was rewound meanwhile)."""
    loop_step = check_loop_program(program)
    spec = unpack_loop(subgraph.loop)
    max_bytes = devices.budget(worker.device, worker.limit)
    inputs = worker._inputs(keys, subgraph)
    runner = LoopRun(spec, loop_inputs(program, loop_step, inputs, seed, worker.device, max_bytes,
                                       worker.memory_budget), seed, str(worker.device),
                     lambda template: _watcher(spec, template, max_bytes, worker.memory_budget))
    carried: Optional[list[Any]] = None
    if start:
        carried = [stored.read(worker.client, checkpoint_tensor_key(keys, subgraph_id, start, k))
                   for k in range(spec.n_carried)]
        if any(value is None for value in carried):
            return None
        carried = [devices.to_device(value, worker.device) for value in carried]
    if worker.wrong_outputs is not None:
        worker.wrong_outputs.instrument(runner)
    if tracer is not None:
        tracer.instrument(runner)

    def on_step(done: int, template: int, run: int, outputs: Any, carried_now: list[Any]) -> None:
        if tracer is not None:
            tracer.step()
        if done == end:
            raise _Reached(carried_now)
    try:
        return runner.run(carried, start, on_step)
    except _Reached as reached:
        return reached.carried


def check_segment(worker: Any, keys: GraphKeys, subgraph_id: Union[int, str], message_id: Any, deliveries: int,
                  fields: dict[bytes, bytes]) -> None:
    """Handle a message that asks for a re-run of a loop segment: a check (vote with its digest), or, with
    `trace`, the disputant's traced re-run."""
    client, spot = worker.client, worker.spot
    try:
        segment = fields[b"segment"].decode()
        start, end, _ = parse_segment(segment)
        trace_for = fields.get(b"trace", b"").decode()
    except (UnicodeDecodeError, ValueError) as exc:
        worker._give_up(keys, message_id, subgraph_id, f"malformed segment check: {exc}", "forged message",
                        fail_graph=False)
        return
    if deliveries > worker.max_attempts:
        worker._give_up(keys, message_id, subgraph_id, f"the check of loop segment {segment} was delivered "
                        f"{deliveries} times and never finished", "too many deliveries")
        return
    pipe = client.pipeline(transaction=False)
    pipe.hmget(keys.meta, "state", "seed", "spot")
    pipe.hexists(keys.segments(subgraph_id), segment)
    pipe.hget(keys.subgraphs, subgraph_id)
    pipe.sismember(keys.done, subgraph_id)
    (state, seed, policy), current, data, done = pipe.execute()
    found = store_votes.check(client, keys, subgraph_id, segment)   # derived from the voters' own keys
    mine = found.digests.get(spot.member)
    settled = None if found.state is None else found.state.encode()
    if state != graph_states.RUNNING.encode() or not policy or data is None or done:
        worker._ack(message_id)   # ended, or not a spot-checked graph's loop (a forged message)
        return
    if trace_for:
        if trace_for != spot.member:
            worker._pass_on(message_id, fields)   # the disputant's own re-run
            return
    elif not current or settled in SETTLED:
        worker._ack(message_id)   # rewound away, or checked already
        return
    elif mine is not None or worker._banned(keys.token, fresh=True) or worker._outvoted(keys) or _peer_waits(worker, keys, subgraph_id, segment, policy):
        # its own user's segment, a second vote, or a check a worker of the runner's class may make: someone
        # else's, unless nobody came by the deadline
        reply = spot.settle(keys, subgraph_id, segment)
        if reply[0] == "split":
            worker._give_up(keys, message_id, subgraph_id, f"verification failed: loop segment {segment} was "
                            f"disputed among {', '.join(reply[1:])} and no majority came within the settle time",
                            "verification failed", worker=",".join(reply[1:]))
        elif reply[0] == "unverified":
            worker._ack(message_id)
        else:
            worker._pass_on(message_id, fields)
        return
    subgraph = plan_pb2.Subgraph.FromString(data)
    program = check(subgraph, devices.budget(worker.device, worker.limit), str(worker.device), int(seed or 0))
    tracer = Tracer() if trace_for or settled == b"disputed" else None
    carried = run_segment(worker, keys, subgraph_id, subgraph, program, int(seed or 0), start, end, tracer)
    if carried is None:
        worker._ack(message_id)
        return
    spec = unpack_loop(subgraph.loop)
    if tracer is not None:
        client.hset(keys.traces(subgraph_id, segment), spot.member, tracer.bytes())
    if not trace_for:
        if worker.wrong_outputs is not None:
            worker.wrong_outputs.lies()
        digest = cross_class.vote(worker, keys, subgraph_id, segment, carried,
                                  redundant.digest(dict(enumerate(carried))), Verify.decode(policy).tolerance, end)
        reply = spot.submit(keys, subgraph_id, digest, segment)
        if reply[0] == "split":
            worker._give_up(keys, message_id, subgraph_id, f"verification failed: loop segment {segment} gave "
                            f"different results on different workers: no majority among {', '.join(reply[1:])}",
                            "verification failed", worker=",".join(reply[1:]))
            return
        if reply[0] == "confirmed" and len(reply) > 1:
            spot.record(keys, subgraph_id, segment, reply[1:], None,
                        f"loop subgraph {subgraph_id} steps {start + 1:,}-{end:,}: {', '.join(reply[1:])} differ "
                        f"from {spot.member} and the majority; banned from this token's work")
    narrow(worker, keys, subgraph_id, segment, spec)
    worker._ack(message_id)


def persisted_values(client: Any, keys: GraphKeys, subgraph: Any) -> dict[int, Any]:
    """{tensor id: value} of what a completed loop's steps persisted, as stored now (its segments settled, rewound
    ones overwritten by their honest re-runs): what the worker completing it seals (ravop.store.seals), in one
    MGET. Values a stopped loop never computed are absent."""
    spec = unpack_loop(subgraph.loop)
    ids = [o.first_id + run for t, template in enumerate(spec.templates) for o in template.outputs
           if o.first_id is not None for run in range(spec.runs(t))]
    names = [keys.tensor(i) for i in ids]
    return {i: stored.decode(client, name, data) for i, name, data in zip(ids, names, client.mget(names) if ids else [])
            if data is not None}


def _peer_waits(worker: Any, keys: GraphKeys, subgraph_id: Union[int, str], segment: str, policy: bytes) -> bool:
    """Whether a check by this worker should wait for a live worker of the runner's numerics class: one of
    another user than the runner's that has not voted, while the check is in the first half of its settle time
    (then anyone of another user checks it, by tolerance)."""
    votes = store_votes.read(worker.client, keys, subgraph_id, segment)
    runner = votes.get(b"#runner")
    runner_class = votes.get(b"#c:" + runner, b"").decode() if runner else ""
    if not runner_class or runner_class == worker.numerics:
        return False
    seconds, micros = worker.client.time()   # the server's clock, which `#since` was read from
    if seconds + micros / 1e6 - float(votes.get(b"#since", 0)) > Verify.decode(policy).settle_seconds / 2:
        return False
    voted = {m for m in votes if not m.startswith(b"#")}
    banned = {b.decode() for b in worker.client.smembers(TokenKeys(keys.token).banned)}
    return any(info.get("numerics") == runner_class and info.get("principal") not in banned
               and info.get("principal", "").encode() not in voted and info["name"] != worker.name
               for info in worker_info.read_all(worker.client))


def narrow(worker: Any, keys: GraphKeys, subgraph_id: Union[int, str], segment: str, spec: LoopSpec) -> None:
    """Once a dispute is settled and the traces of a winner and of a loser are in, record where the loser first
    parts from the winner (once per loser)."""
    client = worker.client
    votes_key = keys.votes(subgraph_id, segment)
    votes = store_votes.read(client, keys, subgraph_id, segment)
    losers = [m for m in votes.get(b"#losers", b"").decode().split(",") if m]
    if votes.get(b"#state") != b"confirmed" or not losers:
        return
    traces = client.hgetall(keys.traces(subgraph_id, segment))
    winner = next((m for m, d in votes.items()
                   if not m.startswith(b"#") and d == votes[b"#accepted"] and m in traces), None)
    if winner is None:
        return
    start = parse_segment(segment)[0]
    for loser in losers:
        if loser.encode() not in traces or not client.hsetnx(votes_key, f"#narrowed:{loser}", 1):
            continue
        found = first_difference(unpack(traces[loser.encode()]), unpack(traces[winner]))
        names = f"worker {_name(loser)} and {_name(winner.decode())}"
        node: Optional[Node] = None
        if found is None:
            text = f"{names} agree op by op over steps {start + 1:,}-{parse_segment(segment)[1]:,} but not on the " \
                   "carried values at its end"
        elif found[1] is None:
            text = f"{names} ran different numbers of steps from step {start + found[0] + 1:,}"
        else:
            offset, template, index = found
            nodes = spec.templates[template].nodes
            node = nodes[min(index, len(nodes) - 1)]
            text = (f"{names} differ first at step {start + offset + 1:,}, op {node.op!r} recorded at "
                    f"{node.source or '(no source recorded)'}")
            if votes.get(f"#c:{loser}".encode()) != votes.get(b"#c:" + winner):   # honest bits may part first
                text += " (of different numerics classes: the first bitwise difference)"
        worker.spot.record(keys, subgraph_id, segment, [loser], node, text)
    if all(f"#narrowed:{loser}".encode() in client.hkeys(votes_key) for loser in losers):
        client.hsetnx(votes_key, "#narrowed", 1)


def _name(member: str) -> str:
    return member.rpartition("@")[0] or member
