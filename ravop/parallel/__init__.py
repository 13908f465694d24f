"""Strategies that train one model on several workers: `NeuralNetwork.fit(..., strategy=...)`, or
`R.Graph(..., strategy=...)` for every fit recorded in the graph, or for the hand-written loops the compiler folds
in a graph without a fit (their replicas are recorded by ravop.parallel.hand_written with the same hooks).

    model.fit(X, y, n_epochs=2, batch_size=256, strategy=R.parallel.LocalSGD(replicas=2, sync_every=8))

They are not runtimes: each one records the training as loop segments (`ravop.record.loop`, a replica's steps between
two synchronisations) and the averaging between them as ordinary ops, so the partitioner makes the replicas'
segments independent subgraphs that idle workers run at once, and a dead worker's segment resumes from its loop
checkpoint like any loop.

A strategy owns its mechanism through hooks the trainer (ravdl/v2/parallel_fit.py) and the compiler
(compiler/passes/strategy.py) call, never through its class: every hook is declared in ravop/parallel/protocol.py
with when it is called and by whom (`Strategy`, and the hooks of each recording a strategy picks with
`record_fit(fit)`: `ShardReplicas`, `GradientReplicas`, `PipelineStages`). The trainer reads and writes the model
only through its train-state interface (ravdl.v2.fit.TrainState).
"""
from .data_parallel import DataParallel
from .diloco import DiLoCo
from .forecast import forecast
from .gossip import Gossip
from .local_sgd import LocalSGD
from .pipeline import Pipeline
from .rounds import Shares
from .protocol import check_strategy  # noqa: F401 - the graph and the trainer check a strategy here

__all__ = ["DataParallel", "DiLoCo", "Gossip", "LocalSGD", "Pipeline", "Shares", "forecast"]
