"""The dashboard's metrics, read from Redis at each scrape: the token's graphs (label `graph`, the id, and
`name`) with their state, progress, loop steps and rate, and the last persisted losses; and the live workers as
their heartbeats advertise them (label `worker`). One scrape costs two round trips plus one per graph."""
import numpy as np
import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..client import training_losses
from ..core import graph_states
from ..core.errors import RavopError
from ..store import GraphKeys
from ..store import graphs as store_graphs
from . import status

STATES = (graph_states.ACTIVATED, graph_states.RUNNING, *graph_states.ENDED)


class GraphCollector(Collector):
    """Collects the metrics of `token`'s graphs and of all live workers of the server `client` talks to."""

    def __init__(self, client, token):
        self.client, self.token = client, token

    def registry(self):
        """A registry holding only this collector (what the dashboard serves)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry

    def collect(self):
        try:
            report = status.cluster(self.client, self.token)
        except redis.RedisError:
            up = GaugeMetricFamily("ravop_up", "1 if the dashboard could read Redis at this scrape")
            up.add_metric([], 0)
            yield up
            return
        up = GaugeMetricFamily("ravop_up", "1 if the dashboard could read Redis at this scrape")
        up.add_metric([], 1)
        yield up
        yield from self._workers(report["workers"])
        yield from self._graphs(report["graphs"])

    def _workers(self, workers):
        busy = GaugeMetricFamily("ravop_worker_running", "1 while the worker runs a subgraph, 0 when idle",
                                 labels=["worker", "device"])
        rss = GaugeMetricFamily("ravop_worker_heartbeat_resident_bytes",
                                "Resident memory the worker advertised with its last heartbeat", labels=["worker"])
        age = GaugeMetricFamily("ravop_worker_heartbeat_age_seconds", "Seconds since the worker's last heartbeat",
                                labels=["worker"])
        for worker in workers:
            name = worker["name"]
            busy.add_metric([name, str(worker.get("device", ""))], float(worker.get("state") == "running"))
            if worker.get("rss") is not None:
                rss.add_metric([name], worker["rss"])
            age.add_metric([name], worker["last_heartbeat_age"])
        count = GaugeMetricFamily("ravop_workers", "Live workers (a heartbeat within its TTL)")
        count.add_metric([], len(workers))
        return [count, busy, rss, age]

    def _graphs(self, graphs):
        state = GaugeMetricFamily("ravop_graph_state", "1 for the graph's current state, 0 for the others",
                                  labels=["graph", "name", "state"])
        progress = GaugeMetricFamily("ravop_graph_progress_percent",
                                     "Percent of the graph's ops run (of its loop steps for a training graph)",
                                     labels=["graph", "name"])
        steps = GaugeMetricFamily("ravop_graph_steps", "Loop steps run so far", labels=["graph", "name"])
        rate = GaugeMetricFamily("ravop_graph_steps_per_second", "Loop steps per second since the graph started",
                                 labels=["graph", "name"])
        loss = GaugeMetricFamily("ravop_graph_loss", "The last persisted loss (kind: training, validation)",
                                 labels=["graph", "name", "kind"])
        loss_step = GaugeMetricFamily("ravop_graph_loss_step", "How many training losses are persisted so far",
                                      labels=["graph", "name"])
        for graph in graphs:
            labels = [graph["id"], graph["name"]]
            for name in STATES:
                state.add_metric(labels + [name], float(graph["state"] == name))
            progress.add_metric(labels, graph["progress"])
            keys = GraphKeys(self.token, graph["id"])
            done = store_graphs.steps_done(self.client, keys)
            steps.add_metric(labels, done)
            if graph["elapsed"]:
                rate.add_metric(labels, done / graph["elapsed"])
            try:
                losses = training_losses.read(self.client, keys, padded=False)   # the computed ones are enough
            except RavopError:   # deleted since it was listed, or a "loss" that is not one value: no loss metrics
                continue
            computed = losses.batch[~np.isnan(losses.batch)]
            if len(computed):
                loss.add_metric(labels + ["training"], float(computed[-1]))
                loss_step.add_metric(labels, len(computed))
            validated = losses.validation[~np.isnan(losses.validation)]
            if len(validated):
                loss.add_metric(labels + ["validation"], float(validated[-1]))
        return [state, progress, steps, rate, loss, loss_step]

