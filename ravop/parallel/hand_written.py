"""`R.Graph(..., strategy=...)` over a hand-written training loop that the compiler folds
(compiler/passes/strategy.py). The compiler finds the loop and its carried values (`compiler.folded_loops`); this
records what the strategy makes of it, at activation by the session (the compiler records nothing), with the
hooks a fit's resident replicas use (`resident_templates`: `extra`, `sync_steps`, `interval`, `finish`), into a
scratch graph the compiler splices in place of the folded loop (`compile_graph(..., replicas=)`). Each replica's
loop is recorded with a stand-in training step, which the compiler replaces by the folded step (its batches
being the replica's share of the loop's steps); its sync templates and the model after training are the
strategy's own, so a hand-written loop synchronises exactly as a fit does."""
import torch

from ..record.graph import scratch_graph
from ..record.loop import Loop
from .protocol import ResidentSync, ShardReplicas, check_hooks, missing_hooks

WHAT_WORKS = ("R.Graph(strategy=...) over a hand-written loop takes LocalSGD, DiLoCo, or Gossip with "
              "interpolation 'constant' or 'clock'")


def check_loop_strategy(strategy):
    """`strategy` if its replicas can run a folded loop, else a clear error naming it and what works."""
    if missing_hooks(strategy, ShardReplicas) or strategy.needs_loss:
        raise NotImplementedError(f"{strategy!r} over a hand-written loop is not implemented: {WHAT_WORKS}; "
                                  f"{type(strategy).__name__} works with fit(..., strategy=...)")
    if strategy.resident is False:
        raise ValueError(f"{strategy!r}: a hand-written loop's replicas always run resident (one loop per "
                         "replica, so the plan does not grow with the steps); resident=False applies to fit: "
                         "leave it out")
    if strategy.update_frequency != 1:
        raise ValueError(f"{strategy!r}: update_frequency applies to fit's batches; a hand-written loop sums its "
                         "gradients itself: leave it out")
    return strategy


class ReplicaLoops:
    """A scratch recording: `graph`, `placeholders` (constants standing for the folded loop's initial carried
    values, in the layout's order), `loops` (replica r's loop op; its first template is the stand-in training
    step) and `final` (the model after training, in the layout's order)."""
    __slots__ = ("graph", "placeholders", "loops", "final")

    def __init__(self, graph, placeholders, loops, final):
        self.graph, self.placeholders, self.loops, self.final = graph, placeholders, loops, final


def record_replica_loops(strategy, carried, layout, steps_per_replica, graph_seed):
    """The replicas' loops of a folded loop whose carried values are `carried` ((shape, dtype) in the order of
    `layout`, a `ravop.parallel.replicas.Carried`), each replica running `steps_per_replica` training steps."""
    with scratch_graph("replicas of a hand-written loop", graph_seed) as graph:
        placeholders = [graph.constant(torch.zeros(shape, dtype=dtype)) for shape, dtype in carried]
        resident = check_hooks(strategy.resident_templates(placeholders, layout, steps_per_replica, graph_seed),
                              ResidentSync, "its resident sync")
        if len({resident.interval(r) for r in range(strategy.replicas)}) > 1:
            raise NotImplementedError(f"{strategy!r} over a hand-written loop is not implemented: its replicas run "
                                      "different steps per round, and a folded loop's steps split equally; use "
                                      "fit(..., strategy=...)")
        loops, finals = [], []
        for r in range(strategy.replicas):
            loop = Loop(placeholders + resident.extra(r))
            with loop.step() as step:   # the training step: the compiler puts the folded step in its place
                step.carry(step.carried)
            sync = resident.sync_steps(loop, r, len(placeholders))
            results = loop.run([(0, steps_per_replica)], sync=sync, sync_every=resident.interval(r),
                               close_after_s=resident.close_after_s)
            loops.append(results[0].inputs[0])
            finals.append(list(results))
        final = resident.finish(finals)
    return ReplicaLoops(graph, placeholders, loops, final)
