"""Prometheus metrics during a real training run: a worker process's own `/metrics` (`ravop-worker
--metrics-port`) and the dashboard's, both parsed with prometheus_client's text parser, scraped twice while the
loop runs: the counters and gauges must move."""
import json
import pathlib
import re
import socket
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.tools.dashboard import Dashboard
from worker.serve.worker_metrics import WorkerMetrics

from helpers import wait_for


DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url):
    """{(sample name, frozenset of labels): value} of a /metrics page, parsed by prometheus_client."""
    with urllib.request.urlopen(url, timeout=30) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=")
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, metric, **labels):
    return samples[(metric, frozenset(labels.items()))]


def record_training(epochs):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 64)).astype(np.float32)
    y = X[:, :1] * 2 + 1
    model = NeuralNetwork(Adam(lr=0.001), loss="SquareLoss", validation_data=(X[:100], y[:100]))
    model.add(Dense(128, input_shape=(64,)))
    model.add(Activation("relu"))
    model.add(Dense(1))
    return model.fit(X, y, n_epochs=epochs, batch_size=50)


def test_metrics_move_during_a_training_run(engine, workers):
    port = free_port()
    name, = workers.start(1, extra=["--metrics-port", str(port), "--checkpoint-steps", "100"])
    worker_url = f"http://127.0.0.1:{port}/metrics"
    board = Dashboard(engine.client, engine.token).start()
    try:
        idle = scrape(worker_url)
        assert value(idle, "ravop_worker_loop_steps_total", worker=name) == 0
        assert value(idle, "ravop_worker_resident_memory_bytes", worker=name) > 10 * 2**20
        R.Graph(name="metrics-train")
        record_training(epochs=150)    # 20 training steps and one validation step an epoch: 3,150 steps
        R.activate()
        R.execute()
        graph = engine.graph_id

        def steps(samples):
            return value(samples, "ravop_worker_loop_steps_total", worker=name)
        first = wait_for(lambda: (lambda s: s if steps(s) > 0 else None)(scrape(worker_url)),
                         "the worker's metrics to count loop steps")
        board_first = scrape(board.url + "metrics")
        second = wait_for(lambda: (lambda s: s if steps(s) > steps(first) else None)(scrape(worker_url)),
                          "the loop steps to move")
        board_second = wait_for(
            lambda: (lambda s: s if value(s, "ravop_graph_steps", graph=graph, name="metrics-train")
                     > value(board_first, "ravop_graph_steps", graph=graph, name="metrics-train") else None)(
                scrape(board.url + "metrics")), "the graph's steps to move")
        R.track_progress()
        # the worker counts a subgraph just after the store has it: the graph may read done a moment before (the
        # fit is one subgraph: the loop makes its own zero moments)
        done = wait_for(lambda: (lambda s: s if value(s, "ravop_worker_subgraphs_total", worker=name) >= 1
                                 else None)(scrape(worker_url)), "the worker to count its last subgraph")
        board_done = scrape(board.url + "metrics")
    finally:
        board.stop()
    # the worker: busy while it trains, its store traffic and steps counted, checkpoints written
    assert value(second, "ravop_worker_busy_seconds_total", worker=name) > \
        value(first, "ravop_worker_busy_seconds_total", worker=name)
    assert steps(done) == 3150
    assert value(done, "ravop_worker_store_read_bytes_total", worker=name) >= 1000 * 64 * 4   # X went up once
    # the fit is one subgraph, its loop: what its writer stores is counted, 3,150 float32 losses and at least one
    # checkpoint of the parameters (64 x 128 + 128 + 128 + 1 floats; their Adam moments besides)
    assert value(done, "ravop_worker_store_written_bytes_total", worker=name) >= \
        3150 * 4 + (64 * 128 + 128 + 128 + 1) * 4
    assert value(done, "ravop_worker_checkpoint_writes_total", worker=name) >= 1
    assert value(done, "ravop_worker_takeovers_total", worker=name) == 0
    # the dashboard: the graph's state, progress and rate, and its losses as they are persisted
    labels = dict(graph=graph, name="metrics-train")
    assert value(board_first, "ravop_graph_state", state="running", **labels) == 1
    assert 0 < value(board_first, "ravop_graph_progress_percent", **labels) < 100
    assert value(board_second, "ravop_graph_steps_per_second", **labels) > 0
    assert value(board_second, "ravop_graph_loss_step", **labels) > value(board_first, "ravop_graph_loss_step",
                                                                          **labels) or \
        value(board_second, "ravop_graph_loss_step", **labels) == 3000
    assert np.isfinite(value(board_second, "ravop_graph_loss", kind="training", **labels))
    assert value(board_done, "ravop_graph_state", state="done", **labels) == 1
    assert value(board_done, "ravop_graph_steps", **labels) == 3150
    assert value(board_done, "ravop_graph_loss_step", **labels) == 3000
    assert value(board_done, "ravop_graph_loss", kind="validation", **labels) < \
        value(board_first, "ravop_graph_loss", kind="training", **labels)
    assert value(board_done, "ravop_worker_running", worker=name, device="cpu") in (0, 1)
    # every metric served is documented, and the example Grafana dashboard queries only those
    documented = set(re.findall(r"^\| `(ravop_\w+)`", (DOCS / "operators" / "operations.md").read_text(), re.M))
    served = {sample for sample, _ in {**done, **board_done}} - {s for s, _ in done if s.endswith("_created")}
    assert served <= documented, served - documented
    queried = set(re.findall(r"ravop_\w+", json.dumps(json.loads((DOCS / "grafana-dashboard.json").read_text()))))
    assert queried <= documented and len(queried) >= 10, queried - documented


def test_a_worker_counts_failures_by_reason_and_its_busy_time():
    metrics = WorkerMetrics("w-unit")
    metrics.running(True)
    metrics.failed("rejected plan")
    metrics.failed("rejected plan")
    metrics.running(False)
    busy, idle = metrics.clock.read()
    assert busy > 0 and idle >= 0
    samples = {(s.name, frozenset(s.labels.items())): s.value for family in metrics.registry.collect()
               for s in family.samples}
    assert value(samples, "ravop_worker_failures_total", worker="w-unit", reason="rejected plan") == 2


def test_a_taken_metrics_port_is_refused(engine, workers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AssertionError, match="cannot serve metrics"):
            workers.start(1, extra=["--metrics-port", str(port)])


def test_the_dashboard_of_initialize_serves_metrics(server):
    session = R.initialize(token="metrics-initialize", redis_url=server.url, dashboard=True)
    try:
        samples = scrape(session.dashboard.url + "metrics")
        assert value(samples, "ravop_up") == 1 and value(samples, "ravop_workers") >= 0
    finally:
        session.dashboard.stop()
        session.dashboard = None
