"""Every wait of a new user is bounded and explained: a server that accepts connections but never answers,
a federated graph the embedded default can never run, the embedded server killed mid-run, and which
session `ravop status` finds."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import ravop as R
from ravop.core.errors import ConnectionFailed, GraphStateError
from ravop.store import connect

ROOT = Path(__file__).resolve().parents[2]


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


# A requester on the embedded default with one worker, tracking a graph that runs for a while; it says
# "ready", its server's pid and its worker's pid, and on an error prints it and whether its workers are reaped.
KILLED_SERVER_REQUESTER = textwrap.dedent("""
    import os, sys, time
    import torch
    import ravop as R
    from ravop.core.errors import RavopError
    session = R.initialize(token="killed-server", workers=1)
    R.Graph(name="long")
    x, w = R.t(torch.rand(1200, 1200)), R.t(torch.rand(1200, 1200) / 1200)
    for _ in range(400):
        x = (x @ w).tanh()
    x.persist_op("x")
    R.activate()
    R.execute()
    session.embedded.wait_ready(session.client)
    workers = [process for _, _, process in session.embedded.workers]
    print("ready", session.embedded.server.process.pid, *[p.pid for p in workers], flush=True)
    try:
        R.track_progress(progress_bar=False)
    except RavopError as exc:
        print("error:", exc, flush=True)
    try:
        R.fetch_persisting_op("x")
    except RavopError as exc:
        print("fetch error:", exc, flush=True)
    for _ in range(600):   # the workers exit when SIGTERMed; reaped, they leave no /proc entry (no zombie)
        if not any(os.path.exists(f"/proc/{p.pid}") for p in workers):
            print("workers reaped", flush=True)
            break
        time.sleep(0.1)
    else:
        print("workers left:", [open(f"/proc/{p.pid}/status").read().split()[3] for p in workers], flush=True)
""")


def test_the_embedded_server_killed_mid_run_ends_the_tracking_with_a_clear_error_and_reaps_the_workers(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               RAVOP_DATA_DIR=str(tmp_path))
    env.pop("RAVOP_REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SERVER_REQUESTER], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready"), proc.communicate()[1]
        server_pid = int(line.split()[1])
        time.sleep(1.0)   # inside track_progress
        os.kill(server_pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)   # before: "reconnecting with backoff" forever
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert re.search(r"^error: the embedded server \(unix://.*\) killed by SIGKILL: this session's graphs and its "
                     r"local workers are gone", out, re.MULTILINE), out + err
    assert re.search(r"^fetch error: the embedded server \(unix://.*\) killed by SIGKILL", out, re.MULTILINE), out + err
    assert "workers reaped" in out, out + err
