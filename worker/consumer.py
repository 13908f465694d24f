"""The worker loop: claim a subgraph from the device's stream, run it, write outputs, then complete and ack.

Delivery is at-least-once: a message is acked only after its outputs are stored and the completion script
has run, and work held by a dead worker is taken over with XAUTOCLAIM once idle for `reclaim_idle` seconds.
While a subgraph runs, a heartbeat thread re-claims its message so a slow subgraph is not mistaken for a
dead worker's. Anything wrong with a message lands in the dead-letter stream; the worker keeps running.
"""
import logging
import os
import signal
import threading
import time

import redis
import torch

from ravop import store
from ravop.store import GraphKeys
from ravop.wire import decode_tensor, encode_tensor, plan_pb2

from .cache import TensorCache
from .executor import SubgraphError, execute, prepare

log = logging.getLogger("ravop.worker")


class Worker:
    def __init__(self, client, name, device="cpu", reclaim_idle=30.0, max_attempts=3,
                 cache_bytes=256 * 2**20, max_subgraph_bytes=None, parent_pid=None):
        self.client = client
        self.name = name
        self.device = torch.device(device)
        self.kind = self.device.type
        if self.kind not in store.DEVICE_KINDS:
            raise ValueError(f"unsupported device {device!r}: use cpu or cuda[:N]")
        self.stream = store.queue(self.kind)
        self.reclaim_idle_ms = int(reclaim_idle * 1000)
        self.max_attempts = max_attempts
        self.cache = TensorCache(cache_bytes)
        self.max_subgraph_bytes = max_subgraph_bytes or _default_max_bytes(self.device)
        self.parent_pid = parent_pid
        self.stopping = threading.Event()
        self._complete = client.register_script(store.COMPLETE)
        self._fail = client.register_script(store.FAIL)
        self.ran = 0

    # ------------------------------------------------------------------------------------------ loop

    def run(self):
        store.ensure_groups(self.client)
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        log.info("worker %s serving %s on %s", self.name, self.stream, self.device)
        while not self.stopping.is_set():
            if self.parent_pid and not _alive(self.parent_pid):
                break  # an embedded worker outlives no requester
            self.client.set(store.worker_key(self.kind, self.name), self.device.type, ex=10)
            message = self._next_message()
            if message is not None:
                try:
                    self.handle(*message)
                except redis.ConnectionError:
                    raise
                except Exception as exc:  # whatever a requester put on the queue, the worker survives it
                    log.exception("message %s could not be handled", message[0])
                    self._dead_letter(message[0], message[1], f"{type(exc).__name__}: {exc}")
        self.client.delete(store.worker_key(self.kind, self.name))
        return 0

    def _next_message(self):
        """Stale work of dead workers first, then new work (blocking briefly so SIGTERM is noticed)."""
        _, claimed, _ = self.client.xautoclaim(self.stream, store.GROUP, self.name, self.reclaim_idle_ms,
                                               start_id="0-0", count=1)
        if claimed:
            return claimed[0]
        reply = self.client.xreadgroup(store.GROUP, self.name, {self.stream: ">"}, count=1, block=500)
        if reply:
            return reply[0][1][0]
        return None

    # ------------------------------------------------------------------------------------------ one message

    def handle(self, message_id, fields):
        try:
            token = fields[b"token"].decode()
            graph_id = fields[b"graph"].decode()
            sg_id = int(fields[b"sg"])
        except (KeyError, ValueError, UnicodeDecodeError, TypeError):
            self._dead_letter(message_id, fields, "malformed message")
            return
        keys = GraphKeys(token, graph_id)
        meta = self.client.hmget(keys.meta, "state", "seed")
        if meta[0] is None or meta[0] in (b"failed", b"done"):
            self._ack(message_id)  # graph flushed, failed or finished: nothing left to do
            return
        attempts = self.client.hincrby(keys.attempts, sg_id, 1)
        if attempts > self.max_attempts:
            self._dead_letter(message_id, fields, f"subgraph {sg_id} failed {attempts - 1} deliveries")
            self._fail(keys=[keys.meta], args=[store.error_json(
                error=f"subgraph {sg_id} was delivered {attempts - 1} times without finishing "
                      "(workers died running it)", worker=self.name, subgraph=sg_id)])
            return
        raw = self.client.hget(keys.plan, sg_id)
        subgraph = plan_pb2.Subgraph()
        try:
            if raw is None:
                raise ValueError(f"no subgraph {sg_id} in the plan")
            subgraph.ParseFromString(raw)
        except Exception as exc:  # protobuf raises its own DecodeError for garbage bytes
            self._poisoned(message_id, fields, keys, f"bad subgraph: {exc}", sg_id)
            return
        heartbeat = _Heartbeat(self.client, self.stream, self.name, message_id, self.reclaim_idle_ms / 3000)
        heartbeat.start()
        try:
            outputs = self._run(keys, subgraph, int(meta[1] or 0))
        except SubgraphError as exc:
            node = exc.node
            self._poisoned(message_id, fields, keys, str(exc), sg_id, node)
            return
        finally:
            heartbeat.stop()
        self._store_outputs(keys, outputs)
        successors = []
        for s in subgraph.successors:
            successors += [s, self.stream]
        self.client.hset(keys.ran_by, sg_id, self.name)
        self._complete(keys=[keys.finished, keys.deps, keys.meta],
                       args=[sg_id, len(subgraph.nodes), token, graph_id, *successors])
        self._ack(message_id)
        self.ran += 1

    def _run(self, keys, subgraph, seed):
        steps = prepare(subgraph, self.max_subgraph_bytes)
        env, missing = {}, []
        for i in subgraph.inputs:
            tensor = self.cache.get(keys.tensor(i))
            if tensor is None:
                missing.append(i)
            else:
                env[i] = tensor
        if missing:
            for i, raw in zip(missing, self.client.mget([keys.tensor(i) for i in missing])):
                if raw is None:
                    raise SubgraphError(f"input value {i} is not in the tensor store")
                try:
                    env[i] = decode_tensor(raw)
                except ValueError as exc:
                    raise SubgraphError(f"input value {i}: {exc}") from None
        if self.kind != "cpu":  # one host->device move per subgraph, not per op
            env = {i: t.to(self.device, non_blocking=True) for i, t in env.items()}
        outputs = execute(steps, env, subgraph.outputs, seed, self.device)
        return outputs

    def _store_outputs(self, keys, outputs):
        pipe = self.client.pipeline(transaction=False)
        for i, tensor in outputs.items():
            if not isinstance(tensor, torch.Tensor):
                raise SubgraphError(f"value {i} is not a tensor")
            tensor = tensor.cpu() if tensor.device.type != "cpu" else tensor
            self.cache.put(keys.tensor(i), tensor)
            pipe.set(keys.tensor(i), encode_tensor(tensor))  # same key, same bytes: retries are idempotent
        pipe.execute()

    # ------------------------------------------------------------------------------------------ failures

    def _poisoned(self, message_id, fields, keys, error, sg_id, node=None):
        """The subgraph cannot succeed on any worker: fail its graph with the op and the user's line."""
        log.warning("subgraph %s of graph %s failed: %s", sg_id, keys.graph_id, error)
        self._fail(keys=[keys.meta], args=[store.error_json(
            op=node.op if node is not None else "", error=error, worker=self.name,
            source=node.source if node is not None else "", subgraph=sg_id)])
        self._ack(message_id)

    def _dead_letter(self, message_id, fields, reason):
        log.warning("dead-lettering message %s: %s", message_id, reason)
        entry = {k: v for k, v in fields.items()} if isinstance(fields, dict) else {}
        entry.update({b"reason": reason, b"worker": self.name, b"message": message_id})
        self.client.xadd(store.DEAD_LETTER, entry, maxlen=10_000, approximate=True)
        self._ack(message_id)

    def _ack(self, message_id):
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(self.stream, store.GROUP, message_id)
        pipe.xdel(self.stream, message_id)
        pipe.execute()


class _Heartbeat(threading.Thread):
    """Re-claims the running message now and then, resetting its idle time (torch kernels release the GIL)."""

    def __init__(self, client, stream, name, message_id, interval):
        super().__init__(daemon=True)
        self.client, self.stream, self.name, self.message_id = client, stream, name, message_id
        self.interval = max(interval, 0.05)
        self._done = threading.Event()

    def run(self):
        while not self._done.wait(self.interval):
            try:
                self.client.xclaim(self.stream, store.GROUP, self.name, 0, [self.message_id], justid=True)
            except redis.RedisError:
                return

    def stop(self):
        self._done.set()
        self.join()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _default_max_bytes(device):
    """Half of the device's memory: a subgraph declaring more fails clearly instead of being OOM-killed."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 2
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 8 * 2**30
