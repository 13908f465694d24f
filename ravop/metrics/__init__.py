"""Prometheus metrics (the official `prometheus_client`): a worker's own (`WorkerMetrics`, served by
`ravop-worker --metrics-port P`) and a token's graphs and the live workers as Redis shows them (`GraphCollector`,
served at the dashboard's `/metrics`). Every metric is listed in docs/operations.md."""
from .graph_metrics import GraphCollector
from .worker_metrics import WorkerMetrics

__all__ = ["GraphCollector", "WorkerMetrics"]
