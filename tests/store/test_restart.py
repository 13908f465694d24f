"""A Redis restart mid-graph loses nothing with `appendonly yes`: the worker and a requester waiting in
R.track_progress() reconnect with backoff and say so, the graph completes, and the results are the bits of
the same program run eagerly. Stopped both ways: a clean shutdown (SIGTERM, the default `appendfsync
everysec`) and a crash (SIGKILL, with `appendfsync always`, which is what makes a crash lose nothing)."""
import signal
import subprocess
import threading
import time

import pytest
import redis
import torch

import ravop as R
from ravop.local.embedded import server_binary

from conftest import Workers
from helpers import on_one_thread

N, STEPS = 384, 120


class AofServer:
    """A server on a unix socket in `directory` with an append-only file, that can be stopped and started."""

    def __init__(self, directory, fsync):
        self.socket = str(directory / "redis.sock")
        self.url = f"unix://{self.socket}"
        self.command = [server_binary(), "--port", "0", "--unixsocket", self.socket, "--dir", str(directory),
                        "--appendonly", "yes", "--appendfsync", fsync, "--save", "",
                        "--maxmemory-policy", "noeviction", "--logfile", str(directory / "server.log")]
        self.process = None
        self.start()

    def start(self):
        self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL)
        client = redis.Redis(unix_socket_path=self.socket, socket_timeout=1)
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.ping():
                    break
            except redis.RedisError:  # not listening yet, or loading its append-only file
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.05)
        client.close()

    def stop(self, sig):
        self.process.send_signal(sig)
        self.process.wait(timeout=60)


def program(x, w, tanh=torch.tanh):
    for _ in range(STEPS):
        x = tanh(x @ w)
    return x


@pytest.mark.parametrize("stop_signal, fsync", [(signal.SIGTERM, "everysec"), (signal.SIGKILL, "always")],
                         ids=["shutdown", "crash"])
def test_a_graph_survives_a_redis_restart(tmp_path, capsys, stop_signal, fsync):
    server = AofServer(tmp_path, fsync)
    pool = Workers(server.url, tmp_path)
    try:
        [name] = pool.start(1)
        generator = torch.Generator().manual_seed(0)
        x0, w0 = torch.rand(N, N, generator=generator), torch.rand(N, N, generator=generator) / N
        session = R.initialize(token="restart", redis_url=server.url)
        R.Graph(name="through-a-restart")
        program(R.t(x0), R.t(w0), R.tanh).persist_op("out")
        assert R.activate()["subgraphs"] >= 1
        R.execute()
        tracked = {}
        tracker = threading.Thread(target=lambda: tracked.update(
            error=_catch(lambda: R.track_progress(progress_bar=False, timeout=300))))
        tracker.start()
        keys = session.keys()
        while not session.client.hlen(keys.taken):   # a worker is running it: restart the server now
            time.sleep(0.01)
        server.stop(stop_signal)
        deadline = time.monotonic() + 120
        while "lost the connection to Redis" not in pool.log(name):  # it finished and could not write
            assert time.monotonic() < deadline, pool.log(name)
            time.sleep(0.1)
        time.sleep(1.0)
        server.start()
        tracker.join(timeout=300)
        assert not tracker.is_alive() and tracked["error"] is None, tracked
        assert torch.equal(R.fetch_persisting_op("out"), on_one_thread(program, x0, w0))
        said = capsys.readouterr().err
        assert "lost the connection to Redis" in said and "reconnected to Redis after" in said, (said, pool.log(name))
        log = pool.log(name)
        assert "lost the connection to Redis" in log and "reconnected to Redis after" in log, log
        assert session.client.hget(keys.meta, "state") == b"done"
        R.flush()
    finally:
        pool.stop_all()
        server.stop(signal.SIGTERM)


def _catch(function):
    try:
        function()
    except Exception as exc:  # noqa: BLE001 - reported by the test
        return exc
    return None
