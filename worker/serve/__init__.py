"""Serving: the `ravop-worker` command, the consumer loop that claims subgraphs, heartbeats, take-overs,
calibration at start, the fork server and the worker's own metrics."""
