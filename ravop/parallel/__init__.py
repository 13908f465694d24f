"""Strategies that train one model on several workers: `NeuralNetwork.fit(..., strategy=...)`, or
`R.Graph(..., strategy=...)` for every fit recorded in the graph.

    model.fit(X, y, n_epochs=2, batch_size=256, strategy=R.parallel.LocalSGD(replicas=2, sync_every=8))

They are not runtimes: each one records the training as loop segments (`ravop.loop`, a replica's steps between
two synchronisations) and the averaging between them as ordinary ops, so the partitioner makes the replicas'
segments independent subgraphs that idle workers run at once, and a dead worker's segment resumes from its loop
checkpoint like any loop (ravdl/v2/parallel_fit.py records them for a model).
"""
from .data_parallel import DataParallel
from .gossip import Gossip
from .local_sgd import LocalSGD
from .pipeline import Pipeline
from .placement import placement

__all__ = ["DataParallel", "Gossip", "LocalSGD", "Pipeline", "placement"]


def check_strategy(strategy):
    """`strategy` if it is one of the strategies a fit records, else TypeError naming it."""
    if not isinstance(strategy, (DataParallel, LocalSGD, Gossip, Pipeline)):
        raise TypeError(f"strategy must be one of R.parallel's strategies (DataParallel, LocalSGD, Gossip, "
                        f"Pipeline), not {strategy!r}")
    return strategy
