"""Every hook of a strategy, declared in one place with when it is called and by whom (Ray Train's habit of one
file declaring every callback hook): the trainer and the compiler call these and nothing else of a
strategy, and never ask a strategy's class.

A strategy first meets the session when a graph or a fit is given it (`check_strategy`: the `Strategy` hooks).
At record time the trainer (ravdl/v2/parallel_fit.py, `ParallelFit`) calls `record_fit(fit)`, in which the
strategy picks one of three recordings, each of which reads the hooks of its own protocol below
(`check_hooks` at its start names any that is missing):
- `fit.replicated(self)`: replicas on shards synchronised between segments (`ShardReplicas`: LocalSGD, Gossip,
  DiLoCo), with per fit a `Synchronizer` (segments) or a `ResidentSync` (one loop per replica);
- `fit.gradient_replicas(self)`: each step's gradient cut across replicas (`GradientReplicas`: DataParallel);
- `fit.pipeline(self)`: GPipe stages (`PipelineStages`: Pipeline; ravdl/v2/pipeline_fit.py).
A graph whose strategy no fit used hands it to the compiler (compiler/passes/strategy.py), whose hand-written
loops run as the `ShardReplicas`' resident replicas (ravop/parallel/hand_written.py).
At activation the summary's forecast (ravop/parallel/forecast.py) calls `roles()`."""
from typing import Any, List, Optional, Protocol, Sequence, Tuple, Type, TypeVar

T = TypeVar("T")


class Strategy(Protocol):
    """What every strategy has."""
    replicas: int
    """Replicas of the model (Pipeline: of its stages). Read by the trainer's recordings and by the compiler
    when it replicates a hand-written loop."""

    def record_fit(self, fit: Any) -> List[str]:
        """Called once per `fit(..., strategy=...)` by the trainer (`record_parallel_fit`), while the fit records:
        call the recording of `fit` (a `ParallelFit`) this strategy trains with and return what it returns, the
        training loss names in order."""

    def roles(self) -> List[str]:
        """Called by the summary's forecast at activation (`forecast`), and by the trainer to name the loops
        it recorded: one name per replica or stage ('replica r', 'stage s', 'replica r stage s')."""


class GradientReplicas(Strategy, Protocol):
    """A strategy whose `record_fit` calls `fit.gradient_replicas(self)` (DataParallel)."""

    def slices(self, rows: int) -> List[Tuple[int, int]]:
        """Called by `ParallelFit.gradient_replicas` at every training step as it records: (start, stop) of each
        replica's rows of that step's batch of `rows` rows."""


class ShardReplicas(Strategy, Protocol):
    """A strategy whose `record_fit` calls `fit.replicated(self)`: replicas on shards of the data (LocalSGD,
    Gossip, DiLoCo); the compiler's hand-written loops take these too."""
    resident: Optional[bool]
    """Read by `resident_forms` and by the hand-written loops' check: None (the session picks at activation:
    resident when its live workers can hold every replica at once), True or False."""
    update_frequency: int
    """Read by `ParallelFit.replicated` once per fit: batches whose gradients one optimizer step sums."""
    needs_loss: bool
    """Read by `ParallelFit.replicated` once per fit: whether a segment carries its last loss for the
    synchronizer's `exchange` (a hand-written loop refuses a strategy that needs it)."""

    def shard_rows(self, n_rows: int, rows_per_step: int) -> List[int]:
        """Called by `ParallelFit.replicated` once per fit: the rows of each replica's shard of the fit's `n_rows`
        (contiguous, in replica order), when a step reads `rows_per_step` rows; a clear error when they do not
        split (OnShards: equal shards; DiLoCo with `round`: in proportion to each replica's steps per round)."""

    def segments(self, n_steps: int, r: int) -> List[Tuple[int, int]]:
        """Called by `ParallelFit.replicated` once per replica of a fit whose replicas run as segments: (first
        step, steps) of replica `r`'s runs between two synchronisations, over its `n_steps` (every replica has
        as many runs)."""

    def synchronizer(self, initial: Sequence[Any], layout: Any, graph_seed: int) -> "Synchronizer":
        """Called by `ParallelFit.replicated` once per fit whose replicas run as segments, before the first
        segment is recorded: the fit's synchronisation, from the `initial` carried values (Ops, in the order of
        `layout`, a `ravop.parallel.replicas.Carried`)."""

    def resident_forms(self) -> List[str]:
        """Called by `ParallelFit.replicated` once per fit, before anything of it is recorded: the forms its
        replicas are recorded in, `ravop.record.forms.RESIDENT` and/or `SEGMENTS`; with both, the session picks
        one at activation (ravop/record/forms.py: recording never asks the cluster)."""

    def resident_templates(self, initial: Sequence[Any], layout: Any, n_steps: int,
                           graph_seed: int) -> "ResidentSync":
        """Called by `ParallelFit.replicated` once per fit recorded in the resident form, before its loops, and by
        the session once per folded loop of a hand-written loop's replicas at activation
        (ravop/parallel/hand_written.py): the sync of replicas that each run as one loop of `n_steps` steps."""


class PipelineStages(Strategy, Protocol):
    """A strategy whose `record_fit` calls `fit.pipeline(self)` (Pipeline; ravdl/v2/pipeline_fit.py)."""
    stages: Any
    """Read by `record_pipeline` once per fit: the number of stages, or 'auto' (`fit_to_workers` chooses)."""
    micro_batches: int
    """Read by the resident pipeline's recording: micro-batches per replica of a batch."""
    resident: Optional[bool]
    """Read by `record_pipeline` once per fit: None (resident when possible and the live workers can hold every
    stage at once), True or False."""

    def micro_slices(self, rows: int) -> List[Tuple[int, int]]:
        """Called by `record_pipeline` before it records (to measure the units) and at every training step:
        (start, stop) of each micro-batch of a batch of `rows` rows, replica by replica."""

    def fit_to_workers(self, memory: Sequence[int], boundary: Sequence[int],
                       workers: Sequence[dict]) -> "PipelineStages":
        """Called by `record_pipeline` once per fit when `stages` is 'auto': the pipeline with the fewest stages
        that fit the live `workers`, given each unit's `memory` and `boundary` bytes."""

    def cut(self, costs: Sequence[int]) -> List[Tuple[int, int]]:
        """Called by `record_pipeline` once per fit: (start, stop) of each stage over the units of `costs`."""


class Synchronizer(Protocol):
    """What `ShardReplicas.synchronizer` returns: one per fit whose replicas run as segments."""

    def exchange(self, states: List[List[Any]], losses: List[Any], step: int) -> None:
        """Called by `ParallelFit.replicated` after every interval's segments are recorded: record what a
        synchronisation after `step` steps does, replacing values of each replica's carried values `states[r]`
        (`losses[r]`: [its last loss] when the strategy `needs_loss`)."""

    def finish(self, states: List[List[Any]]) -> List[Any]:
        """Called by `ParallelFit.replicated` once, after the last exchange: the model after fit (carried values
        in the layout's order)."""


class ResidentSync(Protocol):
    """What `ShardReplicas.resident_templates` returns: the sync templates of replicas that each run as one loop
    for the whole fit (ravop/parallel/resident.py, resident_averaging.py)."""
    close_after_s: float
    """Read by the recording of each replica's loop (`Loop.run`): the longest wait in seconds for a value a sync
    template receives as optional (DiLoCo's `close_after`); 0.0 when none is."""

    def interval(self, r: int) -> int:
        """Called once per replica's loop as it is recorded: replica `r`'s sync templates run after every
        `interval(r)` training steps and after the last one."""

    def extra(self, r: int) -> List[Any]:
        """Called once per replica before its loop is recorded: the carried values replica `r` keeps besides its
        train state (DiLoCo's residuals and start)."""

    def sync_steps(self, loop: Any, r: int, n_state: int) -> List[int]:
        """Called once per replica, after its training step is recorded into `loop`: record replica `r`'s sync
        templates into `loop` (its first `n_state` carried values are the train state); the templates' indices."""

    def finish(self, finals: List[List[Any]]) -> List[Any]:
        """Called once, after every replica's loop is recorded: the model after training from each replica's
        carried values after its loop."""


def hooks_of(protocol: type) -> List[Tuple[str, bool]]:
    """(name, whether it is a method) of every hook `protocol` declares, its bases' first."""
    hooks: List[Tuple[str, bool]] = []
    for cls in reversed(protocol.__mro__):
        if cls is object or cls is Protocol or cls.__module__ == "typing":
            continue
        names = [(name, False) for name in cls.__dict__.get("__annotations__", {})]
        names += [(name, True) for name, value in cls.__dict__.items() if callable(value)
                  and not name.startswith("_")]
        hooks += [hook for hook in names if hook[0] not in {name for name, _ in hooks}]
    return hooks


def missing_hooks(obj: Any, protocol: type) -> List[str]:
    """The hooks of `protocol` that `obj` lacks (a method that is not callable is missing)."""
    return [name for name, method in hooks_of(protocol)
            if not hasattr(obj, name) or (method and not callable(getattr(obj, name)))]


def check_hooks(obj: T, protocol: Type[Any], what: str = "strategy") -> T:
    """`obj` if it has every hook of `protocol`, else a TypeError naming the missing ones."""
    missing = missing_hooks(obj, protocol)
    if missing:
        raise TypeError(f"{what} {obj!r} lacks the hook{'s' * (len(missing) > 1)} {', '.join(missing)} of "
                        f"{protocol.__name__} (ravop/parallel/protocol.py)")
    return obj


def check_strategy(strategy: T) -> T:
    """`strategy` if it has a strategy's hooks (`Strategy`), else a TypeError naming what it lacks."""
    missing = ["an instance, not a class"] if isinstance(strategy, type) else missing_hooks(strategy, Strategy)
    if missing:
        raise TypeError(f"strategy must be one of R.parallel's strategies (DataParallel, LocalSGD, Gossip, "
                        f"DiLoCo, Pipeline) or have the hooks of ravop.parallel.protocol.Strategy, not {strategy!r} "
                        f"(missing: {', '.join(missing)})")
    return strategy
