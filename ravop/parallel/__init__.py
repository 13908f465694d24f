"""Strategies that train one model on several workers: `NeuralNetwork.fit(..., strategy=...)`, or
`R.Graph(..., strategy=...)` for every fit recorded in the graph, or for the hand-written loops the compiler folds
in a graph without a fit (their replicas are recorded by ravop.parallel.hand_written with the same hooks).

    model.fit(X, y, n_epochs=2, batch_size=256, strategy=R.parallel.LocalSGD(replicas=2, sync_every=8))

They are not runtimes: each one records the training as loop segments (`ravop.record.loop`, a replica's steps between
two synchronisations) and the averaging between them as ordinary ops, so the partitioner makes the replicas'
segments independent subgraphs that idle workers run at once, and a dead worker's segment resumes from its loop
checkpoint like any loop.

A strategy owns its mechanism through hooks the trainer (ravdl/v2/parallel_fit.py) calls: `record_fit(fit)`
picks the recording (replicas on shards synchronised between segments, replicas of each step's gradient, or
pipeline stages) and, for replicas on shards, `segments(n_steps)` says when they synchronise and
`synchronizer(...)` what a synchronisation records, or `resident_sync(...)` the sync templates of replicas that
each run as one loop for the whole fit (DiLoCo's resident replicas); `roles()` names its replicas or stages for
the summary's forecast (`forecast`). The trainer reads and writes the model only through its train-state
interface (ravdl.v2.fit.TrainState).
"""
from .data_parallel import DataParallel
from .diloco import DiLoCo
from .forecast import forecast
from .gossip import Gossip
from .local_sgd import LocalSGD
from .pipeline import Pipeline

__all__ = ["DataParallel", "DiLoCo", "Gossip", "LocalSGD", "Pipeline", "forecast"]

HOOKS = ("record_fit", "roles")


def check_strategy(strategy):
    """`strategy` if it has a strategy's hooks (`record_fit`, `roles`), else TypeError naming it."""
    if isinstance(strategy, type) or not all(callable(getattr(strategy, hook, None)) for hook in HOOKS):
        raise TypeError(f"strategy must be one of R.parallel's strategies (DataParallel, LocalSGD, Gossip, "
                        f"DiLoCo, Pipeline), not {strategy!r}")
    return strategy
