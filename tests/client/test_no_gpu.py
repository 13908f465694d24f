"""A graph that needs a GPU never waits silently where none can come: the embedded default refuses it at once
and says how to run it; against a cluster without a GPU worker, R.execute(timeout=...) and
R.track_progress(timeout=...) give up naming the missing worker. Real servers and workers throughout; whether
this machine has CUDA is set per test (monkeypatch), so the tests mean the same on a GPU machine."""
import pytest
import torch

import ravop as R
from ravop.client import session as sessions


@pytest.fixture
def embedded():
    """R.initialize() with no URL and no workers: a real embedded server, stopped afterwards."""
    session = R.initialize(token="no-gpu", workers=0)
    yield session
    if sessions._session is session:
        session.close()
        sessions._session = None


def _record_gpu_graph():
    R.Graph(name="needs a gpu", gpu_required="yes")
    x = R.t(torch.ones(100, 100))
    (x @ x).persist_op("p")


def test_embedded_default_without_cuda_refuses_a_gpu_graph_at_once(embedded, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _record_gpu_graph()
    with pytest.raises(R.DeviceUnavailable) as info:
        R.activate()
    message = str(info.value)
    assert "'needs a gpu'" in message and "no GPU here" in message
    assert "ravop-worker --redis" in message and "--device cuda" in message and "drop gpu_required" in message


def test_embedded_cpu_workers_on_a_gpu_machine_say_how_to_use_it(embedded, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _record_gpu_graph()
    with pytest.raises(R.DeviceUnavailable, match=r"R.initialize\(device='cuda'\)"):
        R.activate()


def test_embedded_default_runs_cpu_graphs_as_before(embedded, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    R.Graph(name="cpu graph")
    R.t([1.0, 2.0]).persist_op("x")
    R.activate()   # the refusal is for GPU graphs only


def test_embedded_workers_on_a_missing_gpu_are_refused_before_starting(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = sessions._session
    with pytest.raises(R.DeviceUnavailable, match="sees no CUDA device"):
        R.initialize(token="no-gpu", workers=1, device="cuda")
    assert sessions._session is before


def test_execute_with_timeout_gives_up_naming_the_missing_gpu_worker(engine, workers, capsys):
    workers.start(1)   # a CPU worker: it must leave the GPU work alone
    _record_gpu_graph()
    R.activate()
    with pytest.raises(TimeoutError, match="no GPU worker is running"):
        R.execute(timeout=2)
    assert "waiting for a GPU worker" in capsys.readouterr().err
    with pytest.raises(TimeoutError, match="0 of 1 ops run; no GPU worker is running"):
        R.track_progress(progress_bar=False, timeout=1)


def test_execute_with_timeout_waits_for_the_result(engine, workers):
    workers.start(1)
    _run_a_small_cpu_graph()


# ------------------------------------------------------------------------------------- a subgraph that does not fit

def test_a_subgraph_over_the_memory_budget_fails_clearly_and_the_worker_keeps_serving(engine, workers):
    """The budget a worker checks declared sizes against (on a GPU: at most what is free on it), made small."""
    [name] = workers.start(1, extra=["--max-subgraph-bytes", str(2**20)])
    R.Graph(name="too big")
    x = R.t(torch.ones(1000, 1000))
    (x @ x).persist_op("p")
    R.activate()
    with pytest.raises(R.GraphFailedError) as info:
        R.execute(timeout=60)
    message = str(info.value)
    assert "'matmul'" in message and "(1000, 1000) float32" in message and "limit of 1 MiB" in message
    _still_serves(workers, name)


def test_running_out_of_memory_names_the_op_and_sizes_and_the_worker_keeps_serving(engine, workers):
    """An output whose size depends on the data (bincount of a huge value) cannot be checked before the run;
    the allocation fails in the kernel (the CPU allocator's error here, CUDA's on a GPU)."""
    [name] = workers.start(1)
    R.Graph(name="runs out")
    R.bincount(R.t(torch.tensor([0, 10**13]))).persist_op("counts")
    R.activate()
    with pytest.raises(R.GraphFailedError) as info:
        R.execute(timeout=60)
    message = str(info.value)
    assert "out of memory on cpu at op 'bincount'" in message and "inputs (2,) int64" in message
    assert "its declared output is (-1,) int64" in message
    _still_serves(workers, name)


def _run_a_small_cpu_graph():
    R.Graph(name="fits")
    x = R.t(torch.ones(100, 100))
    (x @ x).persist_op("p")
    R.activate()
    R.execute(timeout=60)   # started and waited for
    assert float(R.fetch_persisting_op("p")[0, 0]) == 100.0


def _still_serves(workers, name):
    _run_a_small_cpu_graph()
    assert workers.alive(name)
