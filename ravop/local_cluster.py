"""A local Redis/Valkey Cluster of N shards on 127.0.0.1, from the server binary the embedded default uses: for
the tests and the benchmark, and to try a cluster on one machine (`python -m ravop.local_cluster 3`).

Each shard is one server process in cluster mode with the settings this project needs of any server:
append-only persistence (a restarted node keeps its graphs) and `noeviction` (a full server refuses writes
instead of silently dropping a graph's tensors). The 16384 slots are split evenly (CLUSTER ADDSLOTSRANGE)
and the nodes introduced to each other (CLUSTER MEET); no replicas.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import redis

from .embedded import _LAUNCHER, _tail, server_binary, stop_processes
from .errors import ConnectionFailed

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

    def __init__(self, shards=3, timeout=30.0):
        if type(shards) is not int or shards < 1:
            raise ValueError(f"a cluster needs at least one shard, not {shards!r}")
        self.dir = tempfile.mkdtemp(prefix="ravop-cluster-")
        self.ports = free_ports(shards)
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
                   "--logfile", os.path.join(node_dir, "server.log")]
        return subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(os.getpid()), *command],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _form(self, timeout):
        deadline = time.monotonic() + timeout
        clients = [wait_until_answers(port, process, deadline, os.path.join(self.dir, str(port)))
                   for port, process in zip(self.ports, self.processes)]
        try:
            per_shard = SLOTS // len(clients)
            for index, client in enumerate(clients):
                last = SLOTS - 1 if index == len(clients) - 1 else (index + 1) * per_shard - 1
                client.execute_command("CLUSTER ADDSLOTSRANGE", index * per_shard, last)
            for port in self.ports[1:]:
                clients[0].execute_command("CLUSTER MEET", "127.0.0.1", port)
            while time.monotonic() < deadline:
                if all(self._ready(client) for client in clients):
                    return
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()
        raise ConnectionFailed(f"the local cluster on ports {self.ports} did not form within {timeout} s")

    def _ready(self, client):
        info = client.cluster("info")
        return info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == len(self.ports)

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
