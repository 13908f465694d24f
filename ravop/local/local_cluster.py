"""A local Redis/Valkey Cluster of N shards on 127.0.0.1, from the server binary the embedded default uses: for
the tests and the benchmark, and to try a cluster on one machine (`python -m ravop.local.local_cluster 3`).

Each shard is one server process in cluster mode with the settings this project needs of any server:
append-only persistence (a restarted node keeps its graphs) and `noeviction` (a full server refuses writes
instead of silently dropping a graph's tensors). The 16384 slots are split evenly (CLUSTER ADDSLOTSRANGE)
and the nodes introduced to each other (CLUSTER MEET). With `replicas`, each primary gets that many replicas
(CLUSTER REPLICATE), as `redis-cli --cluster create --cluster-replicas N` makes them: a primary that dies is
replaced by one of its replicas after `node_timeout_ms` (the server's cluster-node-timeout).
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import redis
from redis.cluster import RedisCluster

from ..core.errors import ConnectionFailed
from .embedded import _LAUNCHER, _tail, server_binary, server_environment, stop_processes

SLOTS = 16384


def free_ports(n):
    """`n` ports free now whose cluster bus ports (port + 10000) are free too."""
    ports, held = [], []
    while len(ports) < n:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        held.append(sock)
        port = sock.getsockname()[1]
        if port + 10000 < 65536 and _free(port + 10000):
            ports.append(port)
    for sock in held:
        sock.close()
    return ports


def _free(port):
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_until_answers(port, process, deadline, log_dir):
    """A client of the server `process` started on `port`, once it answers; ConnectionFailed if it exits or
    does not answer by `deadline` (time.monotonic())."""
    client = redis.Redis(port=port, socket_connect_timeout=1, socket_timeout=5)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ConnectionFailed(f"the server on port {port} exited: {_tail(os.path.join(log_dir, 'server.log'))}")
        try:
            client.ping()
            return client
        except redis.ConnectionError:
            time.sleep(0.02)
    client.close()
    raise ConnectionFailed(f"the server on port {port} did not answer")


class LocalCluster:
    """`shards` server processes forming one cluster; `urls` has one redis:// URL per node (any of them
    reaches the whole cluster). Stopped by `stop()` (or `with`), and by the kernel if this process dies."""

    def __init__(self, shards=3, timeout=30.0, replicas=0, node_timeout_ms=15000):
        if type(shards) is not int or shards < 1:
            raise ValueError(f"a cluster needs at least one shard, not {shards!r}")
        if type(replicas) is not int or replicas < 0:
            raise ValueError(f"replicas must be a non-negative int, not {replicas!r}")
        self.shards, self.node_timeout_ms = shards, node_timeout_ms
        self.dir = tempfile.mkdtemp(prefix="ravop-cluster-")
        self.ports = free_ports(shards * (1 + replicas))   # the primaries first, then their replicas
        self.urls = [f"redis://127.0.0.1:{port}/0" for port in self.ports]
        self.processes = []
        try:
            for port in self.ports:
                self.processes.append(self._start(port))
            self._form(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, port):
        node_dir = os.path.join(self.dir, str(port))
        os.makedirs(node_dir)
        command = [server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", node_dir,
                   "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                   "--appendonly", "yes", "--save", "", "--maxmemory-policy", "noeviction",
                   "--cluster-node-timeout", str(self.node_timeout_ms),
                   "--logfile", os.path.join(node_dir, "server.log")]
        return subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(os.getpid()), *command],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=server_environment())

    def _form(self, timeout):
        deadline = time.monotonic() + timeout
        clients = [wait_until_answers(port, process, deadline, os.path.join(self.dir, str(port)))
                   for port, process in zip(self.ports, self.processes)]
        try:
            per_shard = SLOTS // self.shards
            for index, client in enumerate(clients[:self.shards]):
                last = SLOTS - 1 if index == self.shards - 1 else (index + 1) * per_shard - 1
                client.execute_command("CLUSTER ADDSLOTSRANGE", index * per_shard, last)
            for port in self.ports[1:]:
                clients[0].execute_command("CLUSTER MEET", "127.0.0.1", port)
            replicating = False
            while time.monotonic() < deadline:
                if not replicating and all(self._known(client) for client in clients):
                    for index, client in enumerate(clients[self.shards:]):   # replica i follows primary i % shards
                        primary = clients[index % self.shards].execute_command("CLUSTER MYID")
                        client.execute_command("CLUSTER REPLICATE", primary)
                    replicating = True
                if replicating and all(self._ready(client) for client in clients):
                    return
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()
        raise ConnectionFailed(f"the local cluster on ports {self.ports} did not form within {timeout} s")

    def _known(self, client):
        return int(client.cluster("info")["cluster_known_nodes"]) == len(self.ports)

    def _ready(self, client):
        info = client.cluster("info")
        if info["cluster_state"] != "ok" or not self._known(client):
            return False
        replication = client.info("replication")
        return replication["role"] == "master" or replication.get("master_link_status") == "up"

    def primary_of(self, key):
        """The index in `ports`/`processes` of the node that serves `key` now."""
        url = next(url for url, process in zip(self.urls, self.processes) if process.poll() is None)
        with RedisCluster.from_url(url) as client:
            return self.ports.index(client.get_node_from_key(key).port)

    def stop(self):
        stop_processes(self.processes)
        self.processes = []
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def main(argv=None):
    """Run a local cluster until Ctrl-C, printing its node URLs."""
    args = sys.argv[1:] if argv is None else argv
    with LocalCluster(int(args[0]) if args else 3) as cluster:
        print("\n".join(cluster.urls), flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
