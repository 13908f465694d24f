"""Loop subgraphs: a training loop run on this worker with its carried values resident, its checkpoints,
exchanges with other loops and writes in the background."""
