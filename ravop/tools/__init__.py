"""Operators' tools: the `ravop` command line, `ravop admin`, status reports, the dashboard and the graphs'
Prometheus metrics."""
