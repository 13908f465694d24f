"""The worker loop: take a subgraph from the stream of this worker's device kind, run it, store its outputs,
then complete it (ack, count progress, enqueue the successors that became ready) in the same round trip; on a
cluster, the ack and the enqueueing are a second round trip to the work streams' shard (ravop.store.handoff).

Delivery is at-least-once. A message is acked only by the completion or failure scripts, after the outputs
are stored; a message held by a worker that died is taken over once its heartbeat has been silent for
`dead_after` seconds, and any message nobody works on after `reclaim_idle` (worker/serve/takeover.py); after
`max_attempts` redeliveries in a row without progress (a loop that checkpointed past where it resumed made some:
worker/serve/attempts.py) it is given up on. Whatever a message holds
(garbage, unknown ops, absurd shapes) fails its graph and lands in the dead-letter stream, and the worker
goes on; a kernel error fails the graph at once (it would fail again on any worker: no retries).

A claimed subgraph of a token at its --max-workers quota is passed on for later, one of a token past its worker
time fails its graph naming the quota, and outputs past its --max-memory are not stored (worker/serve/token_usage.py);
a loop yields its worker to another token's waiting work at a step boundary (worker/loops/turns.py).
"""
import logging
import os
import random
import socket
import threading
import time
from typing import TYPE_CHECKING, AbstractSet, Any, Callable, Dict, List, Optional, Union

import redis
import torch
from google.protobuf.message import DecodeError
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from ravop.core import plan_limits
from ravop.core.errors import PlanError, QuotaError, StoreLimitError, UploadIncompleteError, WireFormatError
from ravop.core.numerics_class import numerics_class
from ravop.core.spot_policy import SPOT_SEGMENT_STEPS, Verify, principal_of, tally
from ravop.store import GROUP, GraphKeys, Scripts, TokenKeys, queue
from ravop.store import federated_schema as federated_store
from ravop.store import background_upload as uploads
from ravop.store import same_host
from ravop.store import tensors as stored
from ravop.store import seals
from ravop.store import votes as store_votes
from ravop.store import workers as liveness
from ravop.store.client_types import Client
from ravop.store.connect import Outage
from ravop.store.handoff import Handoff
from ravop.store.keys import quota_key
from ravop.store.row_stream import StreamedRows, streamed_inputs
from ravop.store.scripts import CLAIM_FINISHED, CLAIM_GONE, CLAIM_RUN, CLAIM_UNKNOWN, CLAIM_WAITING
from ravop.store.server_replies import kind_of as server_error_kind
from ravop.wire import plan_pb2, unpack_loop, unpack_nodes

from ..execute import device as devices
from ..execute import memory
from ..execute.cache import TensorCache
from ..execute.run import OVER_BUDGET, KernelError, run
from ..execute.validate import Program, check
from ..loops.hand_back import HandBack
from ..loops.loop_start import LoopStart
from ..loops.turns import Turns
from ..loops.loop_subgraph import (
    RESIDENT_CHECKPOINT_SECONDS, InitialValuesGone, LoopAbandoned, LoopContext, LoopHandedBack, check_loop_program,
    checkpoint_record, drop_checkpoint, run_loop, superseded_inputs, unpaced)
from ..verify import cross_class, redundant
from ..verify.spot import SPLIT, SpotChecks
from ..verify.spot_loop import CheckFailed, LoopSegments, check_segment, drop_segments, persisted_values
from . import attempts, calibrate, warm_connections
from .heartbeat import Heartbeat
from .inbox_watch import InboxWatch
from .worker_metrics import WorkerMetrics, loop_record
from .server_errors import ServerErrors
from .takeover import Taken, Takeover
from .token_usage import PASS, TokenUsage

if TYPE_CHECKING:   # a worker loads neither unless it provides data (--data) or is paced (benchmarks)
    from ..execute.emulated_device import Pacing
    from ..provider.data_provider import Provider

log = logging.getLogger("ravop.worker")
BLOCK_MS = 1000  # longest wait for new work, so a stop request is noticed within a second
POLL_MS = 250    # the wait of a provider in the rounds of a secure graph (its POLL_SECONDS)
BAN_CHECK_SECONDS = 2.0  # how stale this worker's knowledge of a requester banning it may be
PASS_ON_SECONDS = 0.2    # after putting back a message this worker may not run, before taking the next


class _MissingInput(Exception):
    pass


# What the worker does with a claim reply: (worker, keys, subgraph id, message id) -> None
ClaimAction = Callable[["Worker", GraphKeys, int, bytes], None]
# (graph seed, the subgraph's plan bytes, copies to run, spot-checked) of a subgraph claimed to run now
Claimed = tuple[int, bytes, int, bool]


def _forged(why: str) -> ClaimAction:
    """A message no engine sends (someone else put it on the stream): dropped, its graph left alone."""
    def drop(worker: "Worker", keys: GraphKeys, subgraph_id: int, message_id: bytes) -> None:
        worker._give_up(keys, message_id, subgraph_id, why.format(subgraph_id), "forged message", fail_graph=False)
    return drop


def _gone(worker: "Worker", keys: GraphKeys, subgraph_id: int, message_id: bytes) -> None:
    """Flushed since it was queued, or never there: logged, for an operator."""
    worker._give_up(keys, message_id, subgraph_id, f"graph {keys.graph_id} of token {keys.token} is not in Redis",
                    "no such graph", fail_graph=False)


def _finished(worker: "Worker", keys: GraphKeys, subgraph_id: int, message_id: bytes) -> None:
    """Completed by a worker that may have died before delivering what it made ready: delivered, acked."""
    worker.handoff.drain(keys)
    worker._ack(message_id)


def _ended(worker: "Worker", keys: GraphKeys, subgraph_id: int, message_id: bytes) -> None:
    """The graph is not running (failed, done, cancelled, or not started): acked."""
    worker._ack(message_id)


# What the worker does with each claim reply but CLAIM_RUN (ravop/store/scripts.py); any other reply is the state
# of a graph that is not running (`_ended`).
CLAIM_ACTIONS: dict[bytes, ClaimAction] = {
    CLAIM_UNKNOWN.encode(): _forged("subgraph {} is not in the plan of the graph the message names"),
    CLAIM_WAITING.encode(): _forged("subgraph {} is not ready (its inputs are not computed yet); the engine "
                                    "enqueues it then"),
    CLAIM_GONE.encode(): _gone,
    CLAIM_FINISHED.encode(): _finished,
}
_RUN = CLAIM_RUN.encode()


def parse_message(fields: dict[bytes, bytes]) -> tuple[GraphKeys, int]:
    """(GraphKeys, subgraph id) of a queue message; ValueError naming what is wrong with it."""
    try:
        token, graph_id = fields[b"token"].decode(), fields[b"graph"].decode()
        subgraph_id = int(fields[b"subgraph"])
    except KeyError as exc:
        raise ValueError(f"no {exc.args[0].decode()!r} field") from None
    except (UnicodeDecodeError, ValueError, TypeError) as exc:
        raise ValueError(str(exc)) from None
    if subgraph_id < 0:
        raise ValueError(f"negative subgraph id {subgraph_id}")
    return GraphKeys(token, graph_id), subgraph_id


class Worker:
    def __init__(self, client: Client, name: str, device: Union[str, torch.device] = "cpu", reclaim_idle: float = 30.0,
                 max_attempts: int = 3, cache_bytes: int = 256 * 2**20, max_subgraph_bytes: Optional[int] = None,
                 parent_pid: Optional[int] = None, server_gone_after: Optional[float] = None,
                 dead_after: float = liveness.TTL, max_memory_bytes: Optional[int] = None,
                 provider: Optional["Provider"] = None, checkpoint_steps: Optional[int] = None,
                 checkpoint_seconds: Optional[float] = None, wrong_outputs: Optional[redundant.Liar] = None,
                 workers_on_machine: Optional[int] = None,
                 resident_checkpoint_seconds: float = RESIDENT_CHECKPOINT_SECONDS,
                 pacing: Optional["Pacing"] = None) -> None:
        if reclaim_idle <= 0 or dead_after <= 0 or max_attempts < 1:
            raise ValueError(f"need reclaim_idle > 0, dead_after > 0 and max_attempts >= 1, not {reclaim_idle}, "
                             f"{dead_after} and {max_attempts}")
        self.client = client
        self.name = name
        self.device = devices.parse(device)
        devices.use_full_precision(self.device)
        self.kind = self.device.type
        # whose votes this worker's are (its ACL user; its name on an open server) and what decides its bits
        self.principal = principal_of(liveness.acl_user(client), name)
        self.numerics = numerics_class(self.kind, torch.get_num_threads())
        self.stream = queue(self.kind)  # a CPU worker never reads the GPU stream, and vice versa
        self.scripts = Scripts(client)
        self.handoff = Handoff(client, self.scripts)
        self.takeover = Takeover(client, self.stream, name, dead_after, reclaim_idle, self.handoff)
        self.hand_back = HandBack(client, self.stream, self.kind, name, self.takeover, dead_after)
        self.max_attempts = max_attempts
        self.cache = TensorCache(cache_bytes)
        # What a subgraph may declare, and what the process may hold beyond its start (worker/execute/memory.py):
        # given one, the other follows; given neither, this worker's share of the machine's memory.
        self.limit = max_subgraph_bytes or (max_memory_bytes * 2 // 3 if max_memory_bytes else devices.default_limit(
            self.device, workers_on_machine or memory.workers_on_machine(client, name)))
        self.memory_budget = max_memory_bytes or memory.default_budget(self.limit)
        self.value_bytes = stored.fit_to_server(client)  # the largest value written in one piece on this server
        self.server_gone_after = server_gone_after
        if (checkpoint_steps is not None and checkpoint_steps < 0) or \
                (checkpoint_seconds is not None and checkpoint_seconds <= 0) or \
                resident_checkpoint_seconds < 0:
            raise ValueError(f"need checkpoint_steps >= 0, checkpoint_seconds > 0 and resident_checkpoint_seconds "
                             f">= 0, not {checkpoint_steps}, {checkpoint_seconds} and {resident_checkpoint_seconds}")
        self.checkpoint_steps, self.checkpoint_seconds = checkpoint_steps, checkpoint_seconds
        self.resident_checkpoint_seconds = resident_checkpoint_seconds
        self.stopping = threading.Event()
        self.inboxes = InboxWatch(client, self.handoff, name, self.stopping)  # graphs token users start
        self.provider = provider  # a worker.provider.data_provider.Provider if this worker offers data (--data)
        costs = calibrate.measure(self.device, client, name)
        self.store_bytes_per_s = costs["handoff_bytes_per_s"]   # where a loop writes its checkpoints
        self.heartbeat = Heartbeat(client, name, self.kind, self.stream, self.takeover.every, dead_after,
                                   self.stopping, parent_pid, provider.data.names() if provider is not None else None,
                                   info={**self._advertised(), **costs})
        self.completed = 0
        # the checkpoint tensors a taken-over loop reads with its inputs (Worker._claim)
        self._prefetch: list[str] = []
        self._predecessor_gone = False   # until a look finds nothing held under this name (Takeover.predecessor)
        self.metrics = WorkerMetrics(name, self.device)  # served by `ravop-worker --metrics-port`
        self._bans: dict[str, tuple[float, bool]] = {}  # token -> (when to look again, whether it banned this worker)
        self.usage = TokenUsage(client, name)   # the tokens' quotas and worker time (worker/serve/token_usage.py)
        self.wrong_outputs = wrong_outputs  # tests only: a worker.verify.redundant.Liar that perturbs outputs, or None
        self.spot = SpotChecks(self)        # R.Graph(verify='spot') (worker/verify/spot.py)
        # benchmarks only (benchmarks/wan): `pacing` (worker/execute/emulated_device.py, given for
        # --emulate-device-flops or --benchmark-busy-file) installs its hooks here, else nothing checks for it
        self._run_subgraph = self._run_plain if pacing is None else pacing.run_subgraph(self._run_plain)
        self._pace_steps = unpaced if pacing is None else pacing.steps

    def _advertised(self) -> dict[str, Any]:
        """What `ravop status` shows of this worker besides its state (`ravop.store.worker_info`)."""
        return {"device": str(self.device), "kind": self.kind, "threads": torch.get_num_threads(),
                "memory_limit": self.limit, "host": socket.gethostname(), "pid": os.getpid(),
                "principal": self.principal, "numerics": self.numerics}

    def _segment_steps(self) -> int:
        """Steps between a spot-checked loop's checkpoints: at most SPOT_SEGMENT_STEPS, so that honest drift
        across numerics classes stays within the check's tolerance (ravop.core.spot_policy)."""
        steps = self.checkpoint_steps
        return SPOT_SEGMENT_STEPS if not steps else min(steps, SPOT_SEGMENT_STEPS)

    def stop(self) -> None:
        """Stop after the subgraph being run, if any, is finished (safe from a signal handler)."""
        self.stopping.set()

    def run(self) -> int:
        """Serve until `stop()`. Returns 0, or 1 if the server stayed unreachable for `server_gone_after` s or
        refused this worker's credentials (its user was revoked). Any other server error is ridden out."""
        errors = ServerErrors(self.client, self.name)
        errors.repair()
        self._load_scripts()
        warm_connections.warm(self.client)   # registered means ready: no thread opens one on its first command
        self.heartbeat.beat()
        self.heartbeat.start()
        self.inboxes.start()
        log.info("worker %s serving %s on %s", self.name, self.stream, self.device)
        outage = Outage(lambda text: log.warning("worker %s: %s", self.name, text))
        try:
            while not self.stopping.is_set():
                try:
                    if self.provider is not None:
                        self.provider.poll()
                    message = self._next(resume_own=outage.since is not None or errors.since is not None)
                    outage.ok()
                    errors.ok()
                    if message is not None:
                        self._handle(*message)
                except redis.AuthenticationError as exc:  # revoked (`ravop admin worker revoke`): stop
                    log.error("worker %s: Redis refused its credentials (%s); exiting", self.name, exc)
                    return 1
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    # The message being handled stays pending: this worker resumes it once the server is back.
                    wait = outage.lost(exc)
                    if self.server_gone_after is not None and outage.seconds() > self.server_gone_after:
                        log.error("worker %s: Redis unreachable for %.0f s (%s); exiting", self.name,
                                  self.server_gone_after, exc)
                        return 1
                    self.stopping.wait(wait)
                except (redis.RedisError, RedisClusterException) as exc:  # BUSY, WRONGTYPE, CLUSTERDOWN...
                    self.stopping.wait(errors.met(exc))                      # worker/serve/server_errors.py
        finally:
            self.heartbeat.stop()
            self.inboxes.stop()
            self._leave()
        if self.heartbeat.revoked:
            return 1
        log.info("worker %s stopped after %d subgraphs", self.name, self.completed)
        return 0

    def _load_scripts(self) -> None:
        """Put the scripts on the server before registering, so that a first claim costs one round trip; a server
        that refuses SCRIPT LOAD to this worker's user leaves them to load on first use, as before."""
        try:
            self.scripts.load()
        except redis.ResponseError as exc:
            log.info("worker %s: scripts not loaded ahead (%s); they load on first use", self.name, exc)

    def _next(self, resume_own: bool = False) -> Optional[Taken]:
        """(message id, fields, deliveries): after a lost connection, what this worker held when it was lost;
        at start, what a dead process under this worker's name held; then work held by a dead or silent worker,
        then new work."""
        found = self.takeover.own() if resume_own else None
        if found is None and not self._predecessor_gone:   # a restart under this name: its predecessor's work
            found = self.takeover.predecessor()
            self._predecessor_gone = found is None
            if found is not None:
                self.metrics.took_over()
                return found
        if found is None:
            found = self.takeover.next()
            if found is not None:
                self.metrics.took_over()
        if found is not None:
            return found
        # a provider in the rounds of a secure graph polls again soon: each round waits for the others' writes
        block = POLL_MS if self.provider is not None and self.provider.in_rounds() else BLOCK_MS
        reply = self.client.xreadgroup(GROUP, self.name, {self.stream: ">"}, count=1, block=block)
        if reply:
            message_id, fields = reply[0][1][0]
            return message_id, fields, 1
        return None

    # ------------------------------------------------------------------------------------------ one message

    def _handle(self, message_id: bytes, fields: dict[bytes, bytes], deliveries: int) -> None:
        try:
            keys, subgraph_id = parse_message(fields)
        except ValueError as exc:
            self._give_up(None, message_id, "", f"malformed message: {exc}", "malformed message",
                          message=repr(fields)[:300])
            return
        try:
            self._run_message(keys, subgraph_id, message_id, deliveries, fields)
        except (redis.ConnectionError, redis.TimeoutError):
            raise
        except (redis.RedisError, RedisClusterException) as exc:
            if server_error_kind(exc) == "transient":   # the server's state, not the graph's: retried by run()
                raise
            log.exception("worker %s: subgraph %s of graph %s", self.name, subgraph_id, keys.graph_id)
            self._give_up(keys, message_id, subgraph_id, f"the server refused: {exc}", "server error")
        except Exception as exc:  # unforeseen (a bug, or a hostile value): give up on this message, keep serving
            log.exception("worker %s: subgraph %s of graph %s", self.name, subgraph_id, keys.graph_id)
            self._give_up(keys, message_id, subgraph_id, f"{type(exc).__name__}: {exc}", "worker error")

    def _run_message(self, keys: GraphKeys, subgraph_id: int, message_id: bytes, deliveries: int,
                     fields: dict[bytes, bytes]) -> None:
        """Claim the subgraph, check its plan, run it and deliver what it made (or why it failed)."""
        if b"segment" in fields:   # a re-run of a spot-checked loop's segment (worker/verify/spot_loop.py)
            check_segment(self, keys, subgraph_id, message_id, deliveries, fields)
            return
        claimed = self._claim(keys, subgraph_id, message_id, deliveries, fields)
        if claimed is None:
            return
        try:
            self._run_claimed(keys, subgraph_id, message_id, claimed)
        finally:
            self.usage.done(keys.token)   # its worker time, charged to its token

    def _run_claimed(self, keys: GraphKeys, subgraph_id: int, message_id: bytes, claimed: Claimed) -> None:
        seed, data, copies, spot = claimed
        max_bytes = devices.budget(self.device, self.limit)
        checked = self._checked(keys, subgraph_id, message_id, data, max_bytes, seed)
        if checked is None:
            return
        subgraph, program = checked
        self.heartbeat.watch(message_id, keys.graph_id, subgraph_id)
        self.metrics.running(True)
        try:
            self._execute(keys, subgraph_id, message_id, subgraph, program, seed, copies, max_bytes, spot)
        finally:
            self.heartbeat.unwatch()
            self.metrics.running(False)

    def _claim(self, keys: GraphKeys, subgraph_id: int, message_id: bytes, deliveries: int,
               fields: dict[bytes, bytes]) -> Optional[Claimed]:
        """(graph seed, the subgraph's plan bytes, copies to run) if this worker is to run the subgraph now; else
        None, the message having been given up on, passed on or acked as the claim says."""
        self._prefetch = []
        if deliveries > 1:   # taken over: a failed attempt unless the loop checkpointed past where it resumed
            attempt = attempts.count(self.client, keys, subgraph_id, message_id, deliveries)
            if attempt.failures >= self.max_attempts:
                self._give_up_retries(keys, subgraph_id, message_id, deliveries, attempt)
                return None
            self._prefetch = self._checkpoint_names(keys, subgraph_id, attempt.checkpoint)
        reply, banned = self._claim_unless_banned(keys, subgraph_id)
        if banned:
            self._pass_on(message_id, fields)
            return None
        if reply[0] != _RUN:
            CLAIM_ACTIONS.get(reply[0], _ended)(self, keys, subgraph_id, message_id)
            return None
        seed, data, copies, spot = int(reply[1]), reply[2], int(reply[3]), bool(reply[4])
        if deliveries > 1:   # taken over: the last holder may have left keys no record names (ravop.store.flush)
            self.client.hset(keys.meta, "redelivered", 1)
        if spot and (self._banned(keys.token, fresh=True) or self._outvoted(keys)):
            self._pass_on(message_id, fields)
            return None
        if spot and not self.spot.may_run(keys, subgraph_id):
            verdict = self.spot.settle(keys, subgraph_id)   # nobody else may come: a check ends by its deadline
            if verdict[0] == "unverified":
                return seed, data, copies, False   # the runner's user's result stands, as this run recomputes it
            if verdict[0] == SPLIT:
                self._give_up(keys, message_id, subgraph_id, f"verification failed: subgraph {subgraph_id}: a "
                              f"dispute among {', '.join(verdict[1:])} found no majority in time", "verification "
                              "failed", worker=",".join(verdict[1:]))
                return None
            self._pass_on(message_id, fields)   # a check of this worker's own result must be someone else's
            return None
        if copies > 1:
            votes = store_votes.read(self.client, keys, subgraph_id)
            if (self.principal.encode() in votes and len(votes) < copies) or self._banned(keys.token, fresh=True):
                self._pass_on(message_id, fields)  # this worker ran it already (another one must), or is banned
                return None
        over = self.usage.admit(keys, subgraph_id)   # the token's quotas (ravop.store.quotas)
        if over is not None:
            if over[0] == PASS:   # as many of its subgraphs run as it may: later
                self._pass_on(message_id, fields)
            else:
                self._give_up(keys, message_id, subgraph_id, over[1], "quota")
            return None
        return seed, data, copies, spot

    @staticmethod
    def _checkpoint_names(keys: GraphKeys, subgraph_id: int, checkpoint: Dict[bytes, bytes]) -> List[str]:
        """The keys of the tensors a loop's checkpoint record names, read with the loop's inputs ([] for none)."""
        if not checkpoint:
            return []
        try:
            return list(checkpoint_record(keys, subgraph_id, checkpoint)[4].values())
        except PlanError:   # malformed: the resume says so
            return []

    def _checked(self, keys: GraphKeys, subgraph_id: int, message_id: bytes, data: bytes, max_bytes: int,
                 seed: int) -> Optional[tuple[Any, Program]]:
        """(plan_pb2.Subgraph, worker.execute.validate.Program, its runner built) of a claimed subgraph's plan; None if
        it was refused."""
        try:
            plan_limits.check_bytes(subgraph_id, len(data))      # before decoding: ravop.core.plan_limits
            subgraph = plan_pb2.Subgraph.FromString(data)
            plan_limits.check_nodes(subgraph_id, len(subgraph.nodes.id))
            return subgraph, check(subgraph, max_bytes, str(self.device), seed)
        except DecodeError as exc:
            self._give_up(keys, message_id, subgraph_id, f"subgraph {subgraph_id} is not a valid plan: {exc}",
                          "rejected plan")
        except PlanError as exc:
            self._give_up(keys, message_id, subgraph_id, str(exc), "rejected plan", exc.node)
        return None

    def _execute(self, keys: GraphKeys, subgraph_id: int, message_id: bytes, subgraph: Any, program: Program, seed: int,
                 copies: int, max_bytes: int, spot: bool = False) -> None:
        """Run a checked subgraph and store its outputs; a failure gives the message up with its reason."""
        failed = False
        try:
            outputs = self._compute(keys, subgraph_id, subgraph, program, seed, max_bytes, spot, copies)
            is_loop = subgraph.HasField("loop")   # under verify='spot' checked per segment, as it runs
            if self.wrong_outputs is not None and not (spot and is_loop) and self.wrong_outputs.lies():
                outputs = redundant.perturb(outputs)
            if copies > 1:   # sealed before the vote: what the requester checks at fetch
                self._seal(keys, outputs)
                if not self._verified(keys, subgraph_id, message_id, outputs, copies, program):
                    return
            if spot and not is_loop:
                vote = self._spot_vote(keys, subgraph_id, outputs)
                if vote != redundant.digest(outputs):   # another class's run within tolerance: its bits are
                    outputs = cross_class.adopted(self, keys, subgraph_id, vote, outputs)   # the result's
                self._seal(keys, outputs)
                if not self.spot.accepted(keys, subgraph_id, message_id, vote,
                                          program.steps[0] if program.steps else None):
                    return
            elif spot:   # a loop, its segments checked as it ran: its outputs and what its steps persisted sealed
                self._seal(keys, {**persisted_values(self.client, keys, subgraph), **outputs})
            self._finish(keys, subgraph_id, message_id, outputs)
            if spot and not is_loop:   # the values its voters kept for a check of another class
                cross_class.drop(self.client, keys, subgraph_id, None, len(outputs))
            if is_loop:
                if spot:
                    drop_segments(self.client, keys, subgraph_id)
                drop_checkpoint(self.client, keys, subgraph_id)
        except KernelError as exc:
            if exc.reason == OVER_BUDGET:  # keep serving: drop what this worker holds for reuse, then report
                self.cache.clear()
                devices.release_cached(self.device)
            self._give_up(keys, message_id, subgraph_id, str(exc), exc.reason, exc.node)
            failed = True
        except LoopHandedBack as exc:
            self._hand_back(keys, subgraph_id, message_id)
            log.info("worker %s: loop subgraph %s of graph %s handed back after %d steps (%s)", self.name,
                     subgraph_id, keys.graph_id, exc.steps, "stopping" if self.stopping.is_set() else "taking turns")
        except PlanError as exc:   # a loop's templates, and the runner's ops, are checked when they are built
            self._give_up(keys, message_id, subgraph_id, str(exc), "rejected plan", exc.node)
        except LoopAbandoned:
            self._ack(message_id)
        except CheckFailed as exc:   # a segment's dispute found no majority by its deadline
            self._give_up(keys, message_id, subgraph_id, str(exc), "verification failed", worker=",".join(exc.workers))
        except _MissingInput as exc:
            if self.client.sismember(keys.done, subgraph_id):
                self._ack(message_id)  # another worker finished it meanwhile and its inputs were released
            else:
                self._give_up(keys, message_id, subgraph_id, f"input value {exc} of subgraph {subgraph_id} is "
                              "not in Redis (deleted by R.flush()?)", "missing input")
        except InitialValuesGone as exc:
            if self.client.sismember(keys.done, subgraph_id):
                self._ack(message_id)  # another worker finished the loop meanwhile and dropped its checkpoint
            else:
                self._give_up(keys, message_id, subgraph_id, str(exc), "missing input")
        except seals.ConstantChanged as exc:
            self._give_up(keys, message_id, subgraph_id, f"an input of subgraph {subgraph_id}: {exc}",
                          "changed constant")
        except WireFormatError as exc:
            self._give_up(keys, message_id, subgraph_id, f"an input of subgraph {subgraph_id}: {exc}", "bad input")
        except UploadIncompleteError as exc:
            self._give_up(keys, message_id, subgraph_id, f"an input of subgraph {subgraph_id}: {exc}",
                          "incomplete upload")
        except StoreLimitError as exc:
            self._give_up(keys, message_id, subgraph_id, str(exc), "server full")
        except QuotaError as exc:
            self._give_up(keys, message_id, subgraph_id, str(exc), "quota")
        if failed:   # out of the except block: the error's traceback no longer holds the kernel's values
            self._return_memory("after a failed subgraph")

    def _return_memory(self, when: str) -> None:
        """Give what a subgraph freed back to the OS (worker/execute/memory.py), logging the RSS it saved."""
        rss = memory.return_to_os()
        if rss is not None:
            log.info("worker %s: RSS %s %s, %s once its values were collected, %s after returning freed memory to "
                     "the OS", self.name, memory.mib(rss[0]), when,
                     *(memory.mib(n) if n is not None else "(unread)" for n in rss[1:]))

    def _compute(self, keys: GraphKeys, subgraph_id: int, subgraph: Any, program: Program, seed: int, max_bytes: int,
                 spot: bool = False, copies: int = 1) -> dict[int, torch.Tensor]:
        """{output id: tensor} of a checked subgraph: a loop's (with its checkpoints) or a plain one's."""
        # a loop's other reads before its first step ride in its inputs' round trip (worker/loops/loop_start.py)
        loop_start = LoopStart(keys, subgraph_id, self._prefetch) \
            if subgraph.HasField("loop") and self.scripts.direct else None
        streamed: AbstractSet[int] = frozenset()
        superseded: AbstractSet[int] = frozenset()
        release = not spot and copies == 1
        if subgraph.HasField("loop"):
            spec, loop_step = unpack_loop(subgraph.loop), check_loop_program(program)
            streamed = streamed_inputs(spec, loop_step.inputs)
            # a resumed loop reads its checkpoint instead of the initial values its first checkpoint released
            superseded = frozenset(superseded_inputs(spec, loop_step))
        # a loop that releases its initial values is handed them (run_loop): not cached, it updates them in place
        inputs = self._inputs(keys, subgraph, loop_start, streamed, superseded, superseded if release else frozenset())
        if subgraph.HasField("loop"):
            self.metrics.loop_started(loop_record(self.client, keys, subgraph_id),
                                      loop_start.progress if loop_start is not None else None)
            try:
                outputs = run_loop(LoopContext(
                    self.client, keys, subgraph_id, subgraph, program, inputs, seed, self.device,
                    checkpoint_steps=self._segment_steps() if spot else self.checkpoint_steps,
                    checkpoint_seconds=self.checkpoint_seconds, resident_checkpoint_seconds=self.resident_checkpoint_seconds, max_bytes=max_bytes,
                    budget=self.memory_budget, stop=self.stopping, work_waiting=self._work_waiting,
                    segments=LoopSegments(self, keys, subgraph_id) if spot else None, cache=self.cache,
                    metrics=self.metrics, loop_start=loop_start, pace_steps=self._pace_steps,
                    turns=Turns(self.client, self.stream, keys, self.usage, self.usage.quota(keys.token).weight),
                    store_bytes_per_s=self.store_bytes_per_s, release_inputs=release))
            finally:
                self.metrics.loop_ended(loop_start.ended if loop_start is not None else None)
            # what the loop's steps and checkpoints freed (gradients, activations, its checkpoint buffer: glibc keeps
            # it) goes back before its outputs go up, when the server holds them beside its last checkpoint
            self._return_memory("after a loop")
            return outputs
        return self._run_subgraph(subgraph, program, inputs, seed)

    def _run_plain(self, subgraph: Any, program: Program, inputs: dict[int, torch.Tensor],
                   seed: int) -> dict[int, torch.Tensor]:
        """{output id: tensor} of a checked plain subgraph (`subgraph`: its plan, which a pacing hook reads)."""
        return run(program, inputs, seed, self.device, self.memory_budget)

    def _inputs(self, keys: GraphKeys, subgraph: Any, loop_start: Optional[LoopStart] = None,
                streamed: AbstractSet[int] = frozenset(), superseded: AbstractSet[int] = frozenset(),
                handed: AbstractSet[int] = frozenset()) -> dict[int, Any]:
        """Input tensors on this worker's device: from the local cache, the rest in one MGET, in the round trip
        of what `loop_start` (a worker.loops.loop_start.LoopStart, or None) reads for a loop. The big ones of
        `streamed` (ravop.store.row_stream.streamed_inputs) are read as their loop reads their rows (not cached);
        one of `superseded` that is gone is left out (its loop resumes from the checkpoint that released it);
        those of `handed` are read from the store and not cached: tensors no one else holds, which their loop
        updates in place."""
        env: dict[int, Any] = {}
        missing: list[int] = []
        for i in subgraph.inputs:
            tensor = None if i in handed else self.cache.get(keys.tensor(i))
            if tensor is None:
                missing.append(i)
            else:
                env[i] = tensor
        names = [keys.tensor(i) for i in missing]
        # with the values, their requester's seals (graphs under a vote: ravop.store.seals), in the same round trip
        if loop_start is not None:
            values, sealed = loop_start.read(self.client, names, keys.constants, missing)
        elif names:   # a cluster's pipelines refuse MGET: two round trips there
            values, sealed = ([self.client.mget(names), self.client.hmget(keys.constants, missing)]  # type: ignore[assignment]
                              if isinstance(self.client, RedisCluster) else
                              self.client.pipeline(transaction=False).mget(names).hmget(keys.constants, missing).execute())
        else:
            values, sealed = [], []
        resumed = loop_start is not None and bool(loop_start.checkpoint)
        for i, name, data, seal in zip(missing, names, values, sealed):
            if data is None and i in superseded and resumed:
                continue   # released by the checkpoint this loop resumes from: no upload to wait for
            reference = same_host.UNREAD if loop_start is None else loop_start.reference(name)
            stream_to = str(self.device) if i in streamed else None
            tensor = stored.decode(self.client, name, data, self.memory_budget, token=keys.token,
                                   reference=reference, stream_to=stream_to) \
                if data is not None else uploads.read_uploaded(self.client, keys, name, self.memory_budget,
                                                               stream_to)   # a big constant going up
            if tensor is None and i in superseded:
                continue
            if tensor is None:
                raise _MissingInput(i)
            if isinstance(tensor, StreamedRows):
                env[i] = tensor
                continue
            seals.check_constant(i, tensor, seal)   # a constant changed after its upload fails here
            self.metrics.read_bytes(tensor.nbytes)
            tensor = devices.to_device(tensor, self.device)
            if i not in handed:
                self.cache.put(name, tensor)
            env[i] = tensor
        return env

    def _finish(self, keys: GraphKeys, subgraph_id: int, message_id: bytes, outputs: dict[int, torch.Tensor]) -> None:
        """Store the outputs (the same bytes under the same keys if this is a retry) and complete the subgraph,
        in one MULTI/EXEC (a big output's chunks just before it): if the server refuses the writes (out of
        memory), the completion does not run."""
        host = {i: devices.to_host(tensor) for i, tensor in outputs.items()}
        total = sum(t.nbytes for t in host.values())
        self.metrics.written_bytes(total)
        self.usage.check_memory(keys.token, total, f"the outputs of subgraph {subgraph_id}")
        # Big outputs are checked against the server's limits first, so that a full server is reported
        # in numbers rather than as a refused transaction.
        chunk = stored.fit_to_server(self.client, total, f"the outputs of subgraph {subgraph_id}",
                                    keys.meta) \
            if total > self.value_bytes else self.value_bytes
        chunks = self.client.pipeline(transaction=False)
        pipe = self.client.pipeline(transaction=True)
        for i, tensor in host.items():
            stored.write(pipe, keys.tensor(i), tensor, chunk, chunks)
        chunks.execute()  # no-op without big outputs; their chunks are invisible until their headers are set
        self.scripts.complete_in(pipe, keys, subgraph_id, self.name, self.stream, message_id)
        try:
            status, handed = pipe.execute()[-1]
        except redis.exceptions.NoScriptError:  # the server restarted and lost its scripts; the writes went in
            status, handed = self.scripts.complete(keys, subgraph_id, self.name, self.stream, message_id)
        self.handoff.completed(keys, handed, self.stream, message_id)
        if status == -1:  # the graph was flushed while this subgraph ran: take back what was written
            self.client.delete(*[key for i in outputs for key in stored.keys_of(keys.tensor(i))])
            return
        for i, tensor in outputs.items():
            # Cached as Redis hands it to any other worker: contiguous. A kernel may round differently on a
            # strided view (a transpose), and the next subgraph's result must not depend on who runs it.
            self.cache.put(keys.tensor(i), tensor.contiguous())
        self.completed += 1
        self.metrics.subgraph_done()

    # ------------------------------------------------------------------------------------------ verification

    def _banned(self, token: str, fresh: bool = False) -> bool:
        """Whether a requester's graph banned this worker (R.Graph(verify=k)). Looked up at most every
        BAN_CHECK_SECONDS per token, so that checking costs no round trip per subgraph, unless `fresh`
        (a verified graph's subgraph, which costs k runs anyway)."""
        now = time.monotonic()
        cached = self._bans.get(token)
        if fresh or cached is None or cached[0] < now:
            return self._note_ban(token, self.client.sismember(TokenKeys(token).banned, self.principal))
        return cached[1]

    def _outvoted(self, keys: GraphKeys) -> bool:
        """Whether a spot check of this graph outvoted this worker's user (the SPOT script's `outvoted`; its
        requester bans it from the token's work when the graph ends, ravop.client.bans)."""
        return f",{self.principal},".encode() in (self.client.hget(keys.meta, "outvoted") or b"")

    def _note_ban(self, token: str, banned: object) -> bool:
        if len(self._bans) > 1000:
            self._bans.clear()
        self._bans[token] = (time.monotonic() + BAN_CHECK_SECONDS, bool(banned))
        return bool(banned)

    def _claim_unless_banned(self, keys: GraphKeys, subgraph_id: int) -> tuple[Any, bool]:
        """(the claim script's reply, or None; whether the graph's requester banned this worker). A ban this worker
        must look up again is read in the claim's round trip (over a slow link, a round trip less before every
        first subgraph of a token): a banned worker that claimed passes the message on, as after a claim whose
        spot check must be someone else's, and the next worker claims it again."""
        known = self._bans.get(keys.token)
        if (known is not None and known[0] >= time.monotonic()) or not self.scripts.direct:   # a cluster: 2 slots
            if self._banned(keys.token):
                return None, True
            return self.scripts.claim(keys, subgraph_id, self.name), False
        pipe = self.client.pipeline(transaction=False)
        pipe.sismember(TokenKeys(keys.token).banned, self.principal)
        stale_quota = self.usage.quota_stale(keys.token)   # read in this round trip too, for `usage.admit`
        if stale_quota:
            pipe.hgetall(quota_key(keys.token))
        self.scripts.claim_in(pipe, keys, subgraph_id, self.name)
        banned, *quota, reply = pipe.execute(raise_on_error=False)
        for answer in (banned, *quota):
            if isinstance(answer, Exception):
                raise answer
        if stale_quota:
            self.usage.note_quota(keys.token, quota[0])
        if isinstance(reply, redis.exceptions.NoScriptError):   # the server lost its scripts: loaded again
            reply = self.scripts.claim(keys, subgraph_id, self.name)
        elif isinstance(reply, Exception):
            raise reply
        return reply, self._note_ban(keys.token, banned)

    def _pass_on(self, message_id: bytes, fields: dict[bytes, bytes]) -> None:
        """Put the message back at the end of the stream for another worker, and give them a moment to take it."""
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(self.stream, fields)
        pipe.xack(self.stream, GROUP, message_id)
        pipe.xdel(self.stream, message_id)
        pipe.execute()
        # jittered: workers passing on each other's messages in lockstep (one may run only A, the other only B,
        # and each always reads the other's) would never get theirs
        self.stopping.wait(PASS_ON_SECONDS * random.uniform(0.5, 1.5))

    def _spot_vote(self, keys: GraphKeys, subgraph_id: int, outputs: dict[int, torch.Tensor]) -> str:
        """The digest this worker votes for its outputs of a spot-checked subgraph: its own, or that of a run of
        another numerics class within the graph's tolerance (worker/verify/cross_class.py)."""
        tolerance = Verify.decode(self.client.hget(keys.meta, "spot")).tolerance
        return cross_class.vote(self, keys, subgraph_id, None, [outputs[k] for k in sorted(outputs)],
                                redundant.digest(outputs), tolerance)

    def _seal(self, keys: GraphKeys, outputs: dict[int, torch.Tensor]) -> None:
        """Record this principal's digests of its outputs (ravop.store.seals)."""
        pipe = self.client.pipeline(transaction=False)
        seals.write(pipe, keys, self.principal, {k: devices.to_host(v) for k, v in outputs.items()})
        pipe.execute()

    def _verified(self, keys: GraphKeys, subgraph_id: int, message_id: bytes, outputs: dict[int, torch.Tensor],
                  copies: int, program: Program) -> bool:
        """Vote with these outputs. True if this worker should store them and complete the subgraph (the
        votes are in and agree); otherwise the message is acked: a vote still missing, or a disagreement,
        which fails the graph naming the workers and bans those a majority outvoted."""
        votes = self.scripts.vote(keys, subgraph_id, self.principal, redundant.digest(outputs), copies)
        if not votes:
            self._ack(message_id)   # counted; the last of the k workers stores the outputs
            return False
        if len(set(votes.values())) == 1:
            return True
        agreeing, outvoted = tally(votes)
        if outvoted:   # banned by the graph's requester, on these votes (ravop.client.bans)
            who = f"{', '.join(agreeing)} agree; {', '.join(outvoted)} differ (banned from this token's work)"
        else:
            who = f"no majority among {', '.join(sorted(votes))}"
        node = program.steps[0] if program.steps else None
        self._give_up(keys, message_id, subgraph_id, f"verification failed: subgraph {subgraph_id} gave different "
                      f"outputs on different workers: {who}", "verification failed", node,
                      worker=",".join(outvoted or sorted(votes)))
        return False

    # ------------------------------------------------------------------------------------------ giving up

    def _give_up(self, keys: Optional[GraphKeys], message_id: bytes, subgraph_id: Union[int, str], error: str,
                 reason: str, node: Optional[Any] = None, message: str = "", fail_graph: bool = True,
                 worker: Optional[str] = None) -> None:
        """Ack the message, log it to the dead-letter stream and fail its graph (if it names one, unless
        `fail_graph` is False), naming `worker` (default: this one)."""
        log.warning("worker %s gives up on %s: %s: %s", self.name, message_id, reason, error)
        self.metrics.failed(reason)
        self.scripts.fail(keys, self.stream, message_id, subgraph_id=str(subgraph_id), worker=worker or self.name,
                          op=node.op if node is not None else "", source=node.source if node is not None else "",
                          error=error, reason=reason, message=message, fail_graph=fail_graph)

    def _give_up_retries(self, keys: GraphKeys, subgraph_id: int, message_id: bytes, deliveries: int,
                         attempt: attempts.Attempt) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(keys.taken, subgraph_id)
        pipe.hget(keys.subgraphs, subgraph_id)
        taken, data = pipe.execute()
        node = None
        if data is not None:
            try:
                nodes = unpack_nodes(plan_pb2.Subgraph.FromString(data).nodes)
                node = nodes[0] if nodes else None
            except (DecodeError, PlanError):
                pass  # named by id only; the plan itself is refused by whoever runs it next
        ops = f" (ops from {node.op!r} on)" if node is not None else ""
        self._give_up(keys, message_id, subgraph_id,
                      f"subgraph {subgraph_id}{ops} was delivered {deliveries} times and never finished, "
                      f"{attempt.failures} times in a row without progress: the workers running it stopped "
                      f"responding (the last was {(taken or b'?').decode()}){attempt.where()}",
                      "too many deliveries", node)

    def _work_waiting(self) -> bool:
        """Whether the loop this worker runs, waiting for another loop's values, should hand itself back: loops
        wait for a worker that idle ones cannot take (worker/loops/hand_back.py: as many yield as are missing)."""
        if self.hand_back.now():
            self.takeover.look_now()   # a dead worker's replica is taken next, not this worker's own again
            return True
        return False

    def _hand_back(self, keys: GraphKeys, subgraph_id: int, message_id: bytes) -> None:
        """Queue the subgraph again as a new message and drop this one, in one transaction: an idle worker
        takes it at once (from its checkpoint) instead of waiting for this one to be declared dead."""
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(self.stream, {"token": keys.token, "graph": keys.graph_id, "subgraph": subgraph_id})
        pipe.xack(self.stream, GROUP, message_id)
        pipe.xdel(self.stream, message_id)
        pipe.execute()

    def _ack(self, message_id: bytes) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(self.stream, GROUP, message_id)
        pipe.xdel(self.stream, message_id)
        pipe.execute()

    def _leave(self) -> None:
        """Unregister; drop this consumer from the group unless it still holds a message (for reclaiming)."""
        try:
            self.usage.flush()   # the tokens' worker time not added yet
            liveness.leave(self.client, self.name, self.kind)
            if self.provider is not None:
                federated_store.withdraw(self.client, self.name)
            if not self.client.xpending_range(self.stream, GROUP, "-", "+", 1, consumername=self.name):
                self.client.xgroup_delconsumer(self.stream, GROUP, self.name)
        except redis.RedisError as exc:
            log.debug("worker %s could not unregister: %s", self.name, exc)
