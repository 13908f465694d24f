"""Every wait of a new user is bounded and explained: a server that accepts connections but never answers,
a federated graph the embedded default can never run, the embedded server killed mid-run, and which
session `ravop status` finds."""
import json
import socket
import time
import uuid

import pytest

import ravop as R
from ravop.errors import ConnectionFailed, GraphStateError
from ravop.store import connect


def test_a_server_that_never_answers_fails_after_the_connect_timeout_not_the_socket_timeout():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(5)   # the kernel accepts connections; nothing ever replies
    try:
        started = time.monotonic()
        with pytest.raises(ConnectionFailed, match=r"cannot reach Redis at redis://127\.0\.0\.1:\d+/0: Timeout"):
            connect(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", timeout=0.5, socket_timeout=600)
        assert time.monotonic() - started < 300   # before: the first PING waited for the 600 s socket timeout
    finally:
        silent.close()


def test_once_connected_commands_wait_for_the_socket_timeout(server):
    client = connect(server.url, timeout=0.5, socket_timeout=42)
    try:
        client.ping()
        pool = client.connection_pool
        assert pool.connection_kwargs["socket_timeout"] == 42
        assert [c.socket_timeout for c in pool._available_connections] == [42]
        assert [c._sock.gettimeout() for c in pool._available_connections] == [42]
    finally:
        client.close()


def test_a_federated_graph_without_providers_on_the_embedded_default_raises_at_activate():
    session = R.initialize(token=f"fed-{uuid.uuid4().hex[:8]}", workers=0, data=[])
    try:
        R.Graph(name="Office Data", approach="federated",
                rules=json.dumps({"rules": {"age": {"min": 18, "max": 80}}, "max_clients": 2}))
        R.federated_mean().persist_op("mean")
        with pytest.raises(GraphStateError, match=r"needs 2 provider\(s\) holding age, but the embedded default "
                                                  r"has 0, and no other can join its private server: .*data="):
            R.activate()
    finally:
        session.close()
