"""`ravop-worker --redis URL --device cpu|cuda[:N] --name NAME`: serve subgraphs until SIGTERM/SIGINT."""
import argparse
import logging
import os
import socket

import redis

from .consumer import Worker


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="ravop-worker", description=__doc__)
    parser.add_argument("--redis", default=os.environ.get("RAVOP_REDIS_URL"),
                        help="Redis URL, e.g. redis://host:6379/0 (default: $RAVOP_REDIS_URL)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--name", default=f"{socket.gethostname()}-{os.getpid()}", help="worker name")
    parser.add_argument("--reclaim-idle", type=float, default=30.0,
                        help="seconds before another worker takes over a silent worker's subgraph")
    parser.add_argument("--max-attempts", type=int, default=3, help="deliveries before a subgraph is dead-lettered")
    parser.add_argument("--cache-mib", type=int, default=256, help="local cache of produced tensors")
    parser.add_argument("--max-subgraph-bytes", type=int, default=None,
                        help="largest declared subgraph memory to accept (default: half the device memory)")
    parser.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.redis:
        print("ravop-worker: give --redis URL or set RAVOP_REDIS_URL")
        return 2
    client = redis.Redis.from_url(args.redis, socket_connect_timeout=5, health_check_interval=30)
    try:
        client.ping()
    except redis.RedisError as exc:
        print(f"ravop-worker: cannot reach Redis at {args.redis}: {exc}")
        return 1
    worker = Worker(client, args.name, device=args.device, reclaim_idle=args.reclaim_idle,
                    max_attempts=args.max_attempts, cache_bytes=args.cache_mib * 2**20,
                    max_subgraph_bytes=args.max_subgraph_bytes, parent_pid=args.parent_pid)
    try:
        return worker.run()
    except KeyboardInterrupt:
        return 0
    except redis.ConnectionError as exc:
        print(f"ravop-worker {args.name}: lost Redis at {args.redis}: {exc}")
        return 1
