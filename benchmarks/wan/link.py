"""Emulated WAN links: one asyncio TCP proxy per provider on 127.0.0.1, in front of the store.

These machines' kernels have no `netem` qdisc, so rate, delay, jitter and loss are applied here, in user space,
per direction ("up": provider -> store, "down": store -> provider), shared by all of a provider's connections:

- rate: a token bucket (`burst` bytes deep): a chunk leaves when the link has sent what was queued before it,
  at `rate` bits/s (the serialisation delay a bottleneck link adds);
- delay: each chunk arrives `delay` s (one way) after it left, plus `jitter` (normal, standard deviation
  `jitter` s), never before the chunk sent before it on its connection (TCP delivers in order);
- loss: TCP does not lose data, it retransmits: each 1448-byte segment is lost with probability `loss`, and a
  chunk with a lost segment (and, in order, what follows it) arrives one retransmission timeout later,
  max(RTO_MIN, round trip), Linux's rule for a loss nobody acknowledges past.
Not emulated: congestion control (slow start, the window after a loss) and queueing against other traffic.

Run as a process of its own (`python -m benchmarks.wan.link CONFIG STATS`), so its CPU time is its own: it
writes every link's byte counters, its listening ports and its CPU seconds to STATS (JSON) every
STATS_SECONDS and when it ends (SIGTERM/SIGINT).
"""
import asyncio
import json
import math
import os
import random
import signal
import sys
import time

SEGMENT = 1448          # bytes of TCP payload per segment on a 1500-byte MTU
RTO_MIN = 0.2           # Linux's minimum retransmission timeout, seconds
CHUNK = 64 * 1024       # read size
MAX_QUEUED = 8 * 2**20  # bytes a connection may have in flight in the proxy before it stops reading (back-pressure)
STATS_SECONDS = 0.2


class Direction:
    """One direction of one link: its schedule (when the transmitter is free) and its counters."""

    def __init__(self, rate_bps, delay_s, jitter_s=0.0, loss=0.0, burst_bytes=64 * 1024, seed=0,
                 rto_min_s=RTO_MIN):
        if rate_bps is not None and rate_bps <= 0:
            raise ValueError(f"rate must be > 0 bits/s (None: unlimited), not {rate_bps!r}")
        if delay_s < 0 or jitter_s < 0 or not 0 <= loss < 1:
            raise ValueError(f"need delay >= 0, jitter >= 0 and 0 <= loss < 1, not {delay_s}, {jitter_s}, {loss}")
        self.bytes_per_s = None if rate_bps is None else rate_bps / 8
        self.delay, self.jitter, self.loss = delay_s, jitter_s, loss
        self.burst, self.rto_min = burst_bytes, rto_min_s
        self.free_at = float("-inf")   # idle since forever: a full bucket
        self.random = random.Random(seed)
        self.bytes = self.chunks = self.retransmits = 0

    def arrival(self, n, now, after=0.0):
        """When a chunk of `n` bytes handed to the link at `now` arrives, given that the one before it on its
        connection arrives at `after`."""
        self.bytes += n
        self.chunks += 1
        left = now
        if self.bytes_per_s is not None:
            # Token bucket: credit of at most `burst` bytes builds up while the link is idle.
            start = max(self.free_at, now - self.burst / self.bytes_per_s)
            self.free_at = start + n / self.bytes_per_s
            left = max(now, self.free_at)
        at = left + self.delay
        if self.jitter:
            at += self.random.gauss(0.0, self.jitter)
        if self.loss:
            segments = math.ceil(n / SEGMENT)
            if self.random.random() < 1 - (1 - self.loss) ** segments:
                self.retransmits += 1
                at += max(self.rto_min, 2 * self.delay)
        return max(at, after, now)


class Link:
    """A provider's link: `up` and `down` Directions, and the proxy's listener in front of `upstream`."""

    def __init__(self, name, up, down, upstream):
        self.name, self.up, self.down, self.upstream = name, up, down, upstream
        self.port = None
        self.connections = 0

    async def start(self):
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _serve(self, client_reader, client_writer):
        self.connections += 1
        try:
            host, port = self.upstream
            server_reader, server_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pump(client_reader, server_writer, self.up),
                             _pump(server_reader, client_writer, self.down))

    def stats(self):
        return {"port": self.port, "connections": self.connections,
                "up": {"bytes": self.up.bytes, "chunks": self.up.chunks, "retransmits": self.up.retransmits},
                "down": {"bytes": self.down.bytes, "chunks": self.down.chunks,
                         "retransmits": self.down.retransmits}}


async def _pump(reader, writer, direction):
    """Read from one end, deliver to the other at the times `direction` gives; closes `writer` at the end."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()
    queued = 0
    drained = asyncio.Event()
    last = 0.0

    async def deliver():
        nonlocal queued
        try:
            while True:
                at, data = await queue.get()
                if data is None:
                    break
                wait = at - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
                queued -= len(data)
                drained.set()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    delivering = asyncio.ensure_future(deliver())
    try:
        while True:
            try:
                data = await reader.read(CHUNK)
            except (ConnectionError, OSError):
                break
            if not data:
                break
            last = direction.arrival(len(data), loop.time(), last)
            queued += len(data)
            queue.put_nowait((last, data))
            while queued > MAX_QUEUED and not delivering.done():
                drained.clear()
                await drained.wait()
    finally:
        queue.put_nowait((0.0, None))
        await delivering


def direction_from(spec, seed):
    return Direction(spec.get("rate_bps"), spec.get("delay_s", 0.0), spec.get("jitter_s", 0.0),
                     spec.get("loss", 0.0), spec.get("burst_bytes", 64 * 1024), seed, spec.get("rto_min_s", RTO_MIN))


async def serve(config, stats_path, stop):
    """Start every link of `config` ({"upstream": [host, port], "links": {name: {"up": spec, "down": spec}}})
    and write STATS until `stop` is set."""
    upstream = tuple(config["upstream"])
    links = {name: Link(name, direction_from(spec["up"], 2 * k), direction_from(spec["down"], 2 * k + 1), upstream)
             for k, (name, spec) in enumerate(sorted(config["links"].items()))}
    servers = [await link.start() for link in links.values()]

    def write():
        temporary = f"{stats_path}.tmp"
        with open(temporary, "w") as f:
            json.dump({"pid": os.getpid(), "cpu_s": time.process_time(), "time": time.time(),
                       "links": {name: link.stats() for name, link in links.items()}}, f)
        os.replace(temporary, stats_path)

    try:
        while not stop.is_set():
            write()
            try:
                await asyncio.wait_for(stop.wait(), STATS_SECONDS)
            except asyncio.TimeoutError:
                pass
    finally:
        for server in servers:
            server.close()
        write()


def main(argv=None):
    config_path, stats_path = (argv or sys.argv[1:])[:2]
    with open(config_path) as f:
        config = json.load(f)

    async def run():
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await serve(config, stats_path, stop)
    asyncio.run(run())


if __name__ == "__main__":
    main()
