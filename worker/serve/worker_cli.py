"""`ravop-worker --redis URL --device cpu|cuda[:N] --name NAME`: serve subgraphs until SIGTERM or Ctrl-C, which
let the subgraph being run finish first."""
import argparse
import gc
import logging
import os
import signal
import socket
import sys
import time
from typing import Optional, Sequence

import torch
# torch.autograd.grad imports this module (and sympy) the first time it is handed gradients, which every VJP step
# hands it: 0.24 s and 35 MiB inside the first step of a worker's first loop (resnet18's first step 0.45 s against
# 0.05 s for the others, issue 46). Imported with the worker's modules instead: in the embedded default once, by the
# fork server, for all the workers it forks.
import torch.fx.experimental.symbolic_shapes  # noqa: F401

from ravop.core import numerics_mode
from ravop.core.cpu_threads import machine_cores
from ravop.core.errors import ConnectionFailed
from ravop.store import connect
from ravop.store import workers as liveness
from ravop.store.client_types import Client
from ravop.store.failure_lines import one_line

from ..execute import emulated_device, memory, model_verdicts
from ..loops.checkpoint_cadence import SPACING as CHECKPOINT_SPACING
from ..loops.loop_subgraph import (CHECKPOINT_SECONDS, CHECKPOINT_STEPS, MIN_CHECKPOINT_SECONDS,
                                   RESIDENT_CHECKPOINT_SECONDS)
from ..verify.redundant import Liar
from .consumer import Worker
from .parent_death import die_with_parent


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ravop-worker", description=__doc__)
    parser.add_argument("--redis", default=os.environ.get("RAVOP_REDIS_URL"),
                        help="Redis URL, e.g. redis://host:6379/0 or unix:///path/redis.sock "
                             "(default: $RAVOP_REDIS_URL)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--name", default=f"{socket.gethostname()}-{os.getpid()}",
                        help="worker name, unique among the workers of a server (default: host-pid)")
    parser.add_argument("--dead-after", type=float, default=liveness.TTL, metavar="SECONDS",
                        help="take over the subgraph of a worker whose heartbeat has been silent this long "
                             f"(default: {liveness.TTL:g})")
    parser.add_argument("--reclaim-idle", type=float, default=30.0, metavar="SECONDS",
                        help="take over a subgraph nobody has worked on for this long, even if its worker is "
                             "alive (default: 30)")
    parser.add_argument("--max-attempts", type=int, default=3,
                        help="redeliveries of a subgraph in a row without progress (a training loop that "
                             "checkpointed past where its attempt resumed made some) before it is dead-lettered and "
                             "its graph failed (default: 3)")
    parser.add_argument("--cache-mib", type=int, default=256,
                        help="local cache of tensors this worker produced or fetched (default: 256 MiB)")
    parser.add_argument("--max-subgraph-bytes", type=int, default=None,
                        help="largest memory a subgraph may declare (default: half the device's memory; on a CPU, "
                             "half this worker's share of the machine's: see --workers-on-machine)")
    parser.add_argument("--max-memory-bytes", type=int, default=None,
                        help="memory this worker may take beyond what it holds at start, enforced by the operating "
                             "system on CPU and by torch's allocator on a GPU (default: 1.5 x --max-subgraph-bytes; "
                             "--max-subgraph-bytes defaults to 2/3 of this when only this is given)")
    parser.add_argument("--workers-on-machine", type=int, default=None, metavar="N",
                        help="the default memory budget is this worker's share, 1/N, of the machine's memory "
                             "(default: this one plus the live workers the server lists on this host)")
    parser.add_argument("--checkpoint-steps", type=int, default=None,
                        help="a training loop checkpoints its state to Redis every this many steps (0: by time "
                             f"only; default: {CHECKPOINT_STEPS}, and by time only for resident replicas)")
    parser.add_argument("--checkpoint-seconds", type=float, default=None,
                        help=f"... and every this many seconds (default: as often as checkpoints are cheap: every "
                             f"{CHECKPOINT_SPACING}x what the last one cost, between {MIN_CHECKPOINT_SECONDS:g} and "
                             f"{CHECKPOINT_SECONDS:g} s apart; never while the last is being written)")
    parser.add_argument("--resident-checkpoint-seconds", type=float, default=RESIDENT_CHECKPOINT_SECONDS,
                        help="a loop that exchanges values (a resident replica) checkpoints instead at a "
                             "synchronisation at least this many seconds after its last checkpoint (0: at every "
                             f"one; default: {RESIDENT_CHECKPOINT_SECONDS:g})")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: the cores this process may use); give each of N "
                             "workers on one machine cores / N")
    parser.add_argument("--exit-when-server-gone", type=float, default=None, metavar="SECONDS",
                        help="exit when Redis stays unreachable this long (default: keep retrying)")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit when this process exits (used by the embedded default)")
    parser.add_argument("--data", nargs="+", action="extend", default=[], metavar="PATH",
                        help="CSV or Parquet files this worker offers to federated graphs (it becomes a data "
                             "provider); the data never leaves this process, only statistics of it do")
    parser.add_argument("--min-group-size", type=int, default=os.environ.get("RAVOP_MIN_GROUP_SIZE", "5"),
                        metavar="K", help="withhold a statistic over fewer than K values of this provider "
                                          "(default: $RAVOP_MIN_GROUP_SIZE or 5)")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve this worker's Prometheus metrics at http://HOST:PORT/metrics (0 picks a free "
                             "port, logged; default: not served)")
    parser.add_argument("--metrics-host", default="127.0.0.1",
                        help="address the metrics are served on (default: 127.0.0.1)")
    parser.add_argument("--emulate-device-flops", type=float, default=None, metavar="F",
                        help="for benchmarks only (benchmarks/wan): act as a device of F FLOP/s, sleeping after each "
                             "loop step or subgraph until its FLOPs / F seconds have passed")
    parser.add_argument("--benchmark-busy-file", default=None, metavar="PATH",
                        help="for benchmarks only: write the seconds spent computing to PATH (JSON)")
    parser.add_argument("--epsilon-budget", type=float, default=None, metavar="EPSILON",
                        help="answer only differentially private federated queries, until they have spent this "
                             "much epsilon of the --data files (ledger: <first file>.privacy-ledger.json)")
    parser.add_argument("--test-wrong-outputs", nargs="?", const="always", default=None,
                        help=argparse.SUPPRESS)  # tests of verify=: 'always' or 'after:N' (verify/redundant.py Liar)
    parser.add_argument("--numerics", choices=numerics_mode.MODES,
                        default=os.environ.get(numerics_mode.ENV, numerics_mode.DEFAULT),
                        help="default: torch's kernels (last bits vary by CPU and thread count); reproducible: the "
                             "same bits on every x86 CPU and thread count, slower, refusing ops it does not cover "
                             f"yet (sets {numerics_mode.ENV}; default: that variable, else default)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every start and stop")
    return parser.parse_args(argv)


STARTING_SERVER_SECONDS = 300.0   # an embedded worker's patience with its server (loading a big snapshot)


def _connect(url: str, parent_pid: Optional[int]) -> Client:
    """A client of `url`. A worker started beside its embedded server (--parent-pid) may be up before the
    server listens or has loaded its snapshot: it tries again while its parent lives (which stops it if the
    server never comes), for at most STARTING_SERVER_SECONDS; any other worker fails at once."""
    deadline = time.monotonic() + STARTING_SERVER_SECONDS
    while True:
        try:
            return connect(url)
        except ConnectionFailed:
            if parent_pid is None or os.getppid() != parent_pid or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.environ[numerics_mode.ENV] = args.numerics   # read where kernels are chosen (ravop.runtime.runner)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.redis:
        print("ravop-worker: give --redis URL or set RAVOP_REDIS_URL", file=sys.stderr)
        return 2
    if args.parent_pid is not None and not die_with_parent(args.parent_pid):
        return 0
    if args.threads is not None and args.threads < 1:
        print(f"ravop-worker: --threads must be at least 1, not {args.threads}", file=sys.stderr)
        return 2
    if args.workers_on_machine is not None and args.workers_on_machine < 1:
        print(f"ravop-worker: --workers-on-machine must be at least 1, not {args.workers_on_machine}", file=sys.stderr)
        return 2
    threads = args.threads or machine_cores()
    torch.set_num_threads(threads)
    model_verdicts.share_acceptances()   # a model this machine's workers accepted loads without a sandboxed child
    try:
        pacing = emulated_device.pacing(args.emulate_device_flops, args.benchmark_busy_file)
        if args.data:   # imported only here: a worker without data starts sooner (federated, pandas readers)
            from ..provider.data import ProviderData
            from ..provider.data_provider import Provider
            from ..provider.privacy_ledger import PrivacyLedger
        data = ProviderData.load(args.data) if args.data else None
        if args.epsilon_budget is not None and data is None:
            raise ValueError("--epsilon-budget applies to the data of --data, and none was given")
        ledger = PrivacyLedger.beside(args.data, args.epsilon_budget) if args.epsilon_budget is not None else None
        client = _connect(args.redis, args.parent_pid)
        provider = Provider(client, args.name, data, args.min_group_size, ledger) if data is not None else None
        worker = Worker(client, args.name, device=args.device, reclaim_idle=args.reclaim_idle,
                        max_attempts=args.max_attempts, cache_bytes=args.cache_mib * 2**20,
                        max_subgraph_bytes=args.max_subgraph_bytes, parent_pid=args.parent_pid,
                        server_gone_after=args.exit_when_server_gone, dead_after=args.dead_after,
                        max_memory_bytes=args.max_memory_bytes, provider=provider,
                        checkpoint_steps=args.checkpoint_steps, checkpoint_seconds=args.checkpoint_seconds,
                        resident_checkpoint_seconds=args.resident_checkpoint_seconds,
                        wrong_outputs=Liar.parse(args.test_wrong_outputs) if args.test_wrong_outputs else None,
                        workers_on_machine=args.workers_on_machine, pacing=pacing)
    except Exception as exc:  # noqa: BLE001 - a bad flag, an unreachable or refusing server: one line
        print(f"ravop-worker: {one_line(exc, args.redis)}", file=sys.stderr)
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: worker.stop())
    if args.metrics_port is not None:
        try:
            port = worker.metrics.serve(args.metrics_port, args.metrics_host)
        except OSError as exc:
            print(f"ravop-worker: cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}",
                  file=sys.stderr)
            return 1
        print(f"ravop-worker {args.name}: metrics on http://{args.metrics_host}:{port}/metrics", file=sys.stderr,
              flush=True)
    memory.enforce(worker.device, worker.memory_budget)
    print(f"ravop-worker {args.name}: serving {worker.device} with {threads} torch thread{'s' * (threads > 1)} "
          f"(of {machine_cores()} cores{'' if args.threads else '; --threads to change'}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}), {args.numerics} numerics", flush=True)
    gc.freeze()   # what is loaded by now lives as long as the process: the cyclic GC need not rescan it
    return worker.run()
