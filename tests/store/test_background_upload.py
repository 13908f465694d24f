"""Big constants' chunks sent after the graph's start (ravop.store.background_upload): a worker that must read
the chunks waits for them and gets the exact values, never a partial tensor; a requester that dies mid-upload,
or whose upload fails, fails the graph naming the constant; R.flush stops an upload, and the interpreter's exit
waits for one. Real server, real worker processes and requester processes; an upload is held unfinished by the
module's test hook until the state under test is reached, never by timing."""
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import redis
import torch

import ravop as R
from ravop.client.session import require
from ravop.core.errors import GraphFailedError, WireFormatError
from ravop.store import GraphKeys, background_upload, same_host, tensors
from ravop.store.tensors import marker_key
from ravop.wire.codec import encode_chunked
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20


def big_constant():
    """8 MiB of float32, the same in every process (chunks of 1 MiB: RAVOP_CHUNK_BYTES)."""
    return np.random.default_rng(0).random((2048, 1024), dtype=np.float32)


def record(X):
    R.Graph(name="big constant")
    (R.t(X) * 2).persist_op("y")


def constant_key():
    """The tensor key of the current graph's one deferred constant."""
    [marker] = require().client.keys(require().keys().tensor_prefix + "*:u")
    return marker.decode()[:-2]


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", str(MIB))
    monkeypatch.setattr(background_upload, "BATCH_BYTES", 2 * MIB)   # 4 batches of 2 chunks


@pytest.fixture
def held(monkeypatch):
    """The upload waits before each batch until `go` is set (set at the end in any case)."""
    go = threading.Event()
    monkeypatch.setattr(background_upload, "held_before_sending", lambda key: go.wait())
    yield go
    go.set()


def remote_style_worker(workers, monkeypatch):
    """A worker that may not map the requester's files (as one on another host): it reads the chunks."""
    monkeypatch.setenv("RAVOP_SAME_HOST", "off")
    [name] = workers.start(1, extra=("--verbose",))
    monkeypatch.delenv("RAVOP_SAME_HOST")
    return name


def test_a_worker_that_reads_the_chunks_waits_for_the_upload_and_gets_the_exact_values(engine, workers, small_chunks,
                                                                                       held, monkeypatch):
    name = remote_style_worker(workers, monkeypatch)
    X = big_constant()
    record(X)
    R.activate()
    key = constant_key()
    client = engine.client
    assert client.get(key) is None and client.hget(marker_key(key), "sent") == b"0"   # the start did not wait
    R.execute()
    wait_for(lambda: "still uploading" in workers.log(name), "the worker to wait for the upload")
    assert client.get(key) is None   # held: nothing complete to read yet
    held.set()
    R.track_progress(progress_bar=False, timeout=300)
    assert torch.equal(R.fetch_persisting_op("y"), torch.from_numpy(X) * 2)
    background_upload.finish(engine.token)
    assert client.keys(key + "*") == []   # released after its reader, and nothing written after that


def test_a_local_worker_maps_the_file_and_never_waits_for_the_chunks(engine, workers, small_chunks, held):
    workers.start(1)
    X = big_constant()
    record(X)
    R.activate()
    key = constant_key()
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)   # done while not one chunk was sent
    assert torch.equal(R.fetch_persisting_op("y"), torch.from_numpy(X) * 2)
    assert engine.client.keys(key + "*") == []   # the worker released it
    held.set()
    background_upload.finish(engine.token)
    assert engine.client.keys(key + "*") == []   # the upload found its marker gone: it wrote nothing more


def test_the_chunks_are_the_files_bytes_whatever_the_caller_does_with_its_tensor(engine, small_chunks, held):
    X = big_constant()
    tensor = torch.from_numpy(X.copy())
    R.Graph(name="changed after activate")
    (R.t(tensor) * 2).persist_op("y")
    R.activate()
    key = constant_key()
    tensor.zero_()   # the caller reuses its buffer while the chunks are still to be sent
    held.set()
    background_upload.finish(engine.token)
    assert engine.client.exists(marker_key(key)) == 0
    assert torch.equal(tensors.read(engine.client, key), torch.from_numpy(X))


def open_memory_files():
    """The names of the memory files this process holds open."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:   # the listing's own descriptor, closed meanwhile
            continue
    return [name for name in names if name.startswith("/memfd:ravop-")]


def test_a_constants_file_is_closed_once_its_chunks_are_sent_and_a_later_worker_reads_the_chunks(engine, workers,
                                                                                                small_chunks):
    X = big_constant()
    record(X)
    R.activate()
    key = constant_key()
    nonce = engine.client.get(same_host.reference_key(key)).decode().split(":")[3]
    background_upload.finish(engine.token)
    # The requester no longer holds a copy of the constant: the server has it (issue 46).
    assert not any(nonce in name for name in open_memory_files())
    assert engine.client.exists(marker_key(key)) == 0 and torch.equal(tensors.read(engine.client, key),
                                                                       torch.from_numpy(X))
    workers.start(1)   # too late to map the file: it reads the chunks
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    assert torch.equal(R.fetch_persisting_op("y"), torch.from_numpy(X) * 2)


def test_a_failed_upload_fails_the_graph_naming_the_constant(engine, small_chunks, monkeypatch, capsys):
    def lost(key):
        raise redis.ConnectionError("connection lost (test)")
    monkeypatch.setattr(background_upload, "held_before_sending", lost)
    record(big_constant())
    R.activate()
    key = constant_key()
    background_upload.finish(engine.token)
    R.execute()
    with pytest.raises(GraphFailedError, match=re.escape(key) + " .*failed: ConnectionError: connection lost"):
        R.track_progress(progress_bar=False, timeout=300)
    assert f"upload of constant {key}" in capsys.readouterr().err


def test_r_flush_stops_an_upload_under_way_and_leaves_no_key(engine, small_chunks, held):
    record(big_constant())
    R.activate()
    [upload] = background_upload._running
    flushing = threading.Thread(target=R.flush)
    flushing.start()
    wait_for(upload.cancelled.is_set, "R.flush to stop the upload")
    held.set()
    flushing.join()
    assert not upload.is_alive()
    assert engine.client.keys(f"*{engine.token}*") == []


REQUESTER = """
import os, sys, threading, time
import numpy as np
import ravop as R
from ravop.client.session import require
from ravop.store import background_upload
release = sys.argv[3]
def held(key):   # until the test says so (a file), or for ever
    while not (release and os.path.exists(release)):
        time.sleep(0.01)
background_upload.held_before_sending = held
background_upload.PATIENCE_SECONDS = 1
R.initialize(token=sys.argv[1], redis_url=sys.argv[2])
R.Graph(name="big constant")
(R.t(np.random.default_rng(0).random((2048, 1024), dtype=np.float32)) * 2).persist_op("y")
R.activate()
R.execute()
[marker] = require().client.keys(require().keys().tensor_prefix + "*:u")
print("constant", marker.decode()[:-2], flush=True)
"""


def requester(server, token, release=""):
    """A requester process that activates and executes the graph of `big_constant`, its upload held until the
    file `release` exists ("": for ever); prints its constant's key."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAVOP_CHUNK_BYTES": str(MIB)}
    process = subprocess.Popen([sys.executable, "-c", REQUESTER, token, server.url, release], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line.startswith("constant "), line + process.stderr.read()
    return process, line.split()[1]


def test_a_requester_that_dies_mid_upload_fails_the_graph_naming_the_constant(server, workers, monkeypatch):
    name = remote_style_worker(workers, monkeypatch)
    token = f"test-{uuid.uuid4().hex[:8]}"
    process, key = requester(server, token)
    try:
        wait_for(lambda: "still uploading" in workers.log(name), "the worker to wait for the upload")
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate()
    R.initialize(token=token, redis_url=server.url)
    try:
        with pytest.raises(GraphFailedError, match=re.escape(f"constant {key}: its requester's upload made no progress")):
            R.track_progress(progress_bar=False, timeout=300)
    finally:
        R.flush()
    assert workers.alive(name)


def test_the_interpreter_exit_waits_for_the_upload(server, client, tmp_path):
    token = f"test-{uuid.uuid4().hex[:8]}"
    release = tmp_path / "release"
    process, key = requester(server, token, str(release))
    try:
        assert process.poll() is None and client.get(key) is None   # its script ended; the upload is held
        release.touch()
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        assert torch.equal(tensors.read(client, key), torch.from_numpy(big_constant()))   # every chunk went up
        assert not client.exists(marker_key(key))
    finally:
        release.touch()
        process.kill()
        R.initialize(token=token, redis_url=server.url)
        R.flush()


def test_a_hostile_marker_is_refused_or_bounded(client):
    keys = GraphKeys("hostile-marker-test", "g1")
    key = keys.tensor(1)
    try:
        client.hset(marker_key(key), mapping={"header": b"not a header", "sent": 0})
        with pytest.raises(WireFormatError):
            background_upload.read_uploaded(client, keys, key)
        header, _ = encode_chunked(torch.zeros(1024, 1024), MIB)
        client.hset(marker_key(key), "header", header)
        with pytest.raises(WireFormatError, match="memory budget"):
            background_upload.read_uploaded(client, keys, key, max_bytes=MIB)
    finally:
        client.delete(*tensors.keys_of(key))
    assert background_upload._patience(b"nan") == background_upload.PATIENCE_SECONDS
    assert background_upload._patience(b"1e300") == background_upload.MAX_PATIENCE_SECONDS
    assert background_upload._patience(None) == background_upload.PATIENCE_SECONDS


EMBEDDED = """
import threading
import numpy as np, torch, ravop as R
from ravop.client.session import require
from ravop.store import background_upload
done = threading.Event()
background_upload.held_before_sending = lambda key: done.wait()
R.initialize()
X = np.random.default_rng(0).random((2048, 1024), dtype=np.float32)
R.Graph(name="big constant")
(R.t(X) * 2).persist_op("y")
R.activate()
client, keys = require().client, require().keys()
markers = client.keys(keys.tensor_prefix + "*:u")
print("markers:", len(markers))
R.execute()
R.track_progress(progress_bar=False)
print("exact:", torch.equal(R.fetch_persisting_op("y"), torch.from_numpy(X) * 2))
done.set()
background_upload.finish(require().token)
print("constant keys left:", len(client.keys(markers[0][:-2] + b"*")))
"""


def test_the_embedded_default_runs_while_the_upload_is_held_and_leaves_only_results():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAVOP_WORKERS": "1", "RAVOP_CHUNK_BYTES": str(MIB)}
    env.pop("RAVOP_REDIS_URL", None)
    done = subprocess.run([sys.executable, "-c", EMBEDDED], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert lines == {"markers": "1", "exact": "True", "constant keys left": "0"}, done.stdout + done.stderr[-3000:]
