"""A worker's metrics, labelled `worker`: what it did (subgraphs, loop steps, bytes through the store, failures,
takeovers, checkpoints) as counters the worker loop increments at the events it already has, and what it is
(busy/idle seconds, memory) computed when scraped. Each worker has its own registry, so that several workers in
one process (tests, the embedded default) do not collide."""
import threading
import time
from typing import Any, Callable, Iterator, Optional, Union

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ravop.store.client_types import Client
from ravop.store.keys import GraphKeys

from ..execute.memory import resident_bytes

# (steps done, step of its checkpoint or None) of a loop subgraph, and what reads it
LoopProgress = tuple[int, Optional[int]]
ProgressReader = Callable[[], LoopProgress]


class _Clock:
    """Seconds spent busy (running a subgraph) and idle, the running interval included when read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.busy = self.idle = 0.0
        self.running, self.since = False, time.monotonic()

    def switch(self, running: bool) -> None:
        with self._lock:
            now = time.monotonic()
            if self.running:
                self.busy += now - self.since
            else:
                self.idle += now - self.since
            self.running, self.since = running, now

    def read(self) -> tuple[float, float]:
        """(busy seconds, idle seconds) up to now."""
        with self._lock:
            extra = time.monotonic() - self.since
            return (self.busy + extra, self.idle) if self.running else (self.busy, self.idle + extra)


class _Live(Collector):
    """What is read at scrape time: busy/idle seconds, loop steps and checkpoints of the loop being run (read
    from the loop's own progress record in Redis), memory."""

    def __init__(self, metrics: "WorkerMetrics") -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        busy, idle = m.clock.read()
        for name, value, doc in (("busy", busy, "running a subgraph"), ("idle", idle, "waiting for work")):
            family = CounterMetricFamily(f"ravop_worker_{name}_seconds", f"Seconds spent {doc}", labels=["worker"])
            family.add_metric([m.name], value)
            yield family
        steps, checkpoints = m.loop_totals()
        loops = CounterMetricFamily("ravop_worker_loop_steps", "Loop steps run (training steps)", labels=["worker"])
        loops.add_metric([m.name], steps)
        yield loops
        writes = CounterMetricFamily("ravop_worker_checkpoint_writes", "Loop checkpoints written to the store",
                                     labels=["worker"])
        writes.add_metric([m.name], checkpoints)
        yield writes
        rss = resident_bytes()
        if rss is not None:
            memory = GaugeMetricFamily("ravop_worker_resident_memory_bytes", "Resident memory of the worker process",
                                       labels=["worker"])
            memory.add_metric([m.name], rss)
            yield memory
        device = m.device_bytes()
        if device is not None:
            held = GaugeMetricFamily("ravop_worker_device_memory_bytes",
                                     "Device (GPU) memory held by torch's allocator", labels=["worker", "device"])
            held.add_metric([m.name, str(m.device)], device)
            yield held


def loop_record(client: Client, keys: GraphKeys, subgraph_id: int) -> ProgressReader:
    """() -> (steps done, step of its checkpoint or None) of a running loop subgraph, read in one round trip from
    what the loop writes as it goes (worker/loops/loop_subgraph.py: its step count and its checkpoint record)."""
    def read() -> LoopProgress:
        pipe = client.pipeline(transaction=False)
        pipe.hget(keys.steps, subgraph_id)
        pipe.hget(keys.checkpoint(subgraph_id), "step")
        steps, saved = pipe.execute()
        return int(steps or 0), None if saved is None else int(saved)
    return read


class WorkerMetrics:
    """The metrics of worker `name` on `device`. The worker loop calls the small methods below at its events;
    `loop_progress` is a callable () -> (steps done, checkpoint step) of the loop being run, or None."""

    def __init__(self, name: str, device: Union[str, Any] = "cpu") -> None:
        self.name, self.device = name, device
        self.registry = CollectorRegistry()
        self.clock = _Clock()
        def by_worker(name_: str, doc: str) -> Counter:
            return Counter(name_, doc, labelnames=["worker"], registry=self.registry).labels(name)
        self._subgraphs = by_worker("ravop_worker_subgraphs", "Subgraphs run to completion")
        self._read = by_worker("ravop_worker_store_read_bytes", "Tensor bytes read from the store")
        self._written = by_worker("ravop_worker_store_written_bytes", "Tensor bytes written to the store")
        self._failures = Counter("ravop_worker_failures", "Subgraphs given up on (failed, refused, dead-lettered)",
                                 ["worker", "reason"], registry=self.registry)
        self._takeovers = by_worker("ravop_worker_takeovers", "Subgraphs taken over from a dead or silent worker")
        self._verdicts = Counter("ravop_worker_spot_verdicts", "Results this worker handed to spot checks "
                                 "(verify='spot'), by the verdict: unchecked, hold (checked, or a check of "
                                 "another's), confirmed, complete, again, split", ["worker", "verdict"],
                                 registry=self.registry)
        self._lock = threading.Lock()
        self._steps = self._checkpoints = 0       # of loops finished or left
        self._loop: Optional[list[Any]] = None    # [progress callable, steps at start, checkpoint step last seen]
        self.registry.register(_Live(self))
        self._server: Optional[Any] = None   # prometheus_client's WSGIServer, once serving

    # events ----------------------------------------------------------------------------------------------
    def running(self, running: bool) -> None:
        self.clock.switch(running)

    def subgraph_done(self) -> None:
        self._subgraphs.inc()

    def read_bytes(self, n: int) -> None:
        self._read.inc(n)

    def written_bytes(self, n: int) -> None:
        self._written.inc(n)

    def failed(self, reason: Optional[str]) -> None:
        self._failures.labels(self.name, reason or "unknown").inc()

    def spot_verdict(self, verdict: str) -> None:
        self._verdicts.labels(self.name, verdict).inc()

    def took_over(self) -> None:
        self._takeovers.inc()

    def loop_started(self, progress: ProgressReader, now: Optional[LoopProgress] = None) -> None:
        """A loop subgraph starts; `progress() -> (steps done, step of its checkpoint or None)` reads its record;
        `now`: that pair where the worker read it already (with the loop's inputs: worker/loops/loop_start.py)."""
        steps, saved = progress() if now is None else now
        with self._lock:
            self._loop = [progress, steps, saved]

    def loop_ended(self, now: Optional[LoopProgress] = None) -> None:
        """The loop finished, failed or was handed back: fold what it did into the totals; `now`: its (steps done,
        checkpoint step) where the worker knows them (a loop that completed: not read again before its outputs
        are written)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            steps, checkpoints = self._loop_counts(loop, now)
            with self._lock:
                self._steps += steps
                self._checkpoints += checkpoints

    # reads -----------------------------------------------------------------------------------------------
    def _loop_counts(self, loop: list[Any], now: Optional[LoopProgress] = None) -> tuple[int, int]:
        progress, start, seen = loop
        try:
            steps, saved = progress() if now is None else now
        except Exception:  # noqa: BLE001 - a scrape never fails for a lost server: the last count stands
            return 0, 0
        new_checkpoint = saved is not None and saved != seen
        loop[2] = saved
        return max(steps - start, 0), int(new_checkpoint)

    def loop_totals(self) -> tuple[int, int]:
        """(loop steps run, checkpoints written) so far, the running loop's included. A checkpoint is counted when
        the loop's checkpoint record names a new step, seen at a scrape or at the loop's end."""
        with self._lock:
            loop = self._loop
        if loop is None:
            return self._steps, self._checkpoints
        steps, checkpoint = self._loop_counts(loop)
        with self._lock:
            self._checkpoints += checkpoint
            return self._steps + steps, self._checkpoints

    def device_bytes(self) -> Optional[int]:
        if str(self.device).startswith("cuda"):
            import torch
            return torch.cuda.memory_allocated(self.device)
        return None

    # serving ---------------------------------------------------------------------------------------------
    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics on a daemon thread (prometheus_client's server); returns the port bound."""
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_address[1]
