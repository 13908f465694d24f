"""Start-up (issue 29): the calibration kept per machine, and the embedded workers after the first started once
it has registered. Timings are in benchmarks/bench_startup.py, not here."""
import json
import os
from contextlib import closing

import pytest
import torch

import ravop as R
from ravop.client import session as sessions
from ravop.core.cost_fields import COST_FIELDS
from ravop.local import embedded
from ravop.store import connect
from ravop.store import workers as liveness
from worker.execute import calibration_cache
from worker.serve import calibrate

CPU = torch.device("cpu")


def _counting_measurements(monkeypatch):
    """A list that grows by one each time the device's figures are really timed."""
    timed, real = [], calibrate._measure_device

    def measured(device):
        timed.append(device)
        return real(device)
    monkeypatch.setattr(calibrate, "_measure_device", measured)
    return timed


def test_the_device_figures_are_kept_per_machine_and_timed_again_when_the_key_changes(client, tmp_path,
                                                                                        monkeypatch):
    timed, path = _counting_measurements(monkeypatch), str(tmp_path / "calibration.json")
    first = calibrate.measure(CPU, client, "cache-test", path)
    assert set(first) == set(COST_FIELDS) and len(timed) == 1
    again = calibrate.measure(CPU, client, "cache-test", path)
    assert len(timed) == 1   # read from the file
    assert {f: again[f] for f in COST_FIELDS[:3]} == {f: first[f] for f in COST_FIELDS[:3]}
    assert again["handoff_bytes_per_s"] > 0   # the server's figure is measured every time
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)   # another key: timed again, kept beside the first
        calibrate.measure(CPU, client, "cache-test", path)
        assert len(timed) == 2
        calibrate.measure(CPU, client, "cache-test", path)
        assert len(timed) == 2
    finally:
        torch.set_num_threads(threads)
    with open(path) as f:
        kept = json.load(f)
    assert len(kept) == 2 and calibration_cache.machine_key(CPU) in kept
    key = json.loads(calibration_cache.machine_key(CPU))
    assert key["torch"] == torch.__version__ and key["threads"] == threads and key["model"]


def test_a_damaged_or_disabled_cache_means_timing_again(client, tmp_path, monkeypatch):
    timed, path = _counting_measurements(monkeypatch), tmp_path / "calibration.json"
    path.write_text("{not json")
    calibrate.measure(CPU, client, "cache-test", str(path))
    assert len(timed) == 1 and calibration_cache.machine_key(CPU) in json.loads(path.read_text())
    path.write_text(json.dumps({calibration_cache.machine_key(CPU): {"op_s": "fast"}}))   # not a number
    calibrate.measure(CPU, client, "cache-test", str(path))
    assert len(timed) == 2
    calibrate.measure(CPU, client, "cache-test", "")   # "" ($RAVOP_CALIBRATION_CACHE=): no cache
    calibrate.measure(CPU, client, "cache-test", "")
    assert len(timed) == 4


def test_the_cache_file_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(calibration_cache.CACHE_ENV, str(tmp_path / "c.json"))
    assert calibration_cache.default_path() == str(tmp_path / "c.json")
    monkeypatch.setenv(calibration_cache.CACHE_ENV, "")
    assert calibration_cache.default_path() == ""
    monkeypatch.delenv(calibration_cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert calibration_cache.default_path() == str(tmp_path / "ravop" / "calibration.json")


def test_the_other_embedded_workers_start_once_the_first_has_registered(monkeypatch):
    """Workers importing torch side by side share the cores: the first graph's worker starts alone."""
    if sessions._session is not None:   # an embedded one left running would be kept
        sessions._session.close()
        sessions._session = None
    registered_before, real = {}, embedded.start_worker

    def start_worker(url, name, *args, **kwargs):
        try:
            with closing(connect(url)) as client:
                registered_before[name] = liveness.alive(client, "cpu")
        except R.ConnectionFailed:   # the first starts while the server does
            registered_before[name] = []
        return real(url, name, *args, **kwargs)
    monkeypatch.setattr(embedded, "start_worker", start_worker)
    session = R.initialize(token="startup-order", workers=3)
    try:
        session.embedded.wait_ready(session.client)
        names = [name for name, _, _ in session.embedded.workers]
        assert len(names) == 3 and names[0].endswith("-0")
        assert names[0] not in registered_before[names[0]]
        for later in names[1:]:
            assert names[0] in registered_before[later]
        assert sorted(w["name"] for w in sessions.live_workers() if w["name"] in names) == sorted(names)
    finally:
        session.close()
        sessions._session = None



def test_an_embedded_worker_waits_for_its_server_and_a_lone_one_does_not(monkeypatch, server):
    """A worker started beside its server (--parent-pid) tries again until the server listens; any other one
    reports an unreachable server at once."""
    from worker.serve import worker_cli
    tries, real = [], worker_cli.connect

    def connect_after_three_refusals(url):
        tries.append(url)
        if len(tries) <= 3:
            raise R.ConnectionFailed(f"cannot reach Redis at {url}: not listening yet")
        return real(url)
    monkeypatch.setattr(worker_cli, "connect", connect_after_three_refusals)
    client = worker_cli._connect(server.url, os.getppid())
    try:
        assert client.ping() and len(tries) == 4
    finally:
        client.close()
    tries.clear()
    with pytest.raises(R.ConnectionFailed, match="not listening yet"):
        worker_cli._connect(server.url, None)
    assert len(tries) == 1
