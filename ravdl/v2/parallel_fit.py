"""`fit(..., strategy=...)` (ravop.parallel): the trainer the strategies' hooks drive. It records the training
as loop segments, one per replica between two synchronisations, and whatever the strategy records between them
as ordinary ops; or, with the strategy's `resident_templates` (resident replicas of LocalSGD, Gossip, DiLoCo), one
loop per replica for the whole fit whose sync templates exchange values with the others (ravop.parallel.resident,
ravop.parallel.resident_averaging). Which of the two is the strategy's `resident_forms`: with both (resident=None)
both are recorded, and the session picks one at activation by its live workers (ravop/record/forms.py): recording
never asks the cluster. A segment is a loop op
(`Loop.run(..., segment=...)`): its own subgraph, run with the replica's state in memory, checkpointed and resumed
like any loop, so the replicas of one synchronisation interval are independent subgraphs that idle workers run at
once.

The strategy picks the recording (`strategy.record_fit(fit)` calls one of `ParallelFit.replicated`,
`gradient_replicas`, `pipeline`); the trainer reads and writes the model only through its train-state interface
(`train_state`, `train_step`, `training_loss`, `apply_gradients`, and `pipeline_units` for Pipeline), which
NeuralNetwork, Functional and Pytorch_Model provide.

The losses are persisted under the names `fit` uses (`training_loss_epoch_{e}_batch_{b}`): DataParallel and
Pipeline one per step (the batch's loss, as one worker computes it); replicas on shards (LocalSGD, Gossip,
DiLoCo) one per replica and step, replica r's j-th batch of an epoch being batch `j * replicas + r + 1`.
"""
from typing import Any, Callable, Optional, Sequence, cast

import numpy as np
import torch

import ravop as R
from ravop.core.loop_template import batch_steps
from ravop.core.loss_names import training_loss_name
from ravop.parallel.protocol import (
    GradientReplicas, PipelineStages, ResidentSync, ShardReplicas, Synchronizer, check_hooks, check_strategy)
from ravop.parallel.replicas import Carried, weighted_sum
from ravop.record.forms import RESIDENT, record_forms
from ravop.record.graph import Op, current_graph
from ravop.record.loop import Batches, Loop, Step

from . import trained_values
from .layers.base import as_input
from .pipeline_fit import record_pipeline


def record_parallel_fit(model: Any, X: Any, y: Any, n_epochs: int, batch_size: int, shuffle: bool, seed: int,
                        strategy: Any) -> list[str]:
    """Record the training of `model` under `strategy`; returns the training loss names in order."""
    n_epochs, batch_size = int(n_epochs), int(batch_size)
    if n_epochs < 1 or batch_size < 1:
        raise ValueError(f"n_epochs and batch_size must be >= 1, not {n_epochs} and {batch_size}")
    graph = current_graph()
    graph.strategy_notes.fits.append(check_strategy(strategy))   # compile_graph leaves it unfolded
    fit = ParallelFit(model, X, y, n_epochs, batch_size, shuffle, seed)
    graph.strategy_notes.loops.append(fit.loops)   # ravop.client.placement names the workers that ran them
    names: list[str] = strategy.record_fit(fit)
    # where the next graph starts from (ravdl.v2.trained_values)
    trained_values.persist([slot.get() for slot in model.train_state(_shard(X, 0, 1)).carried])
    return names


class _Steps:
    """The steps of `n_epochs` over `n_rows` rows in batches of `batch_size`: the templates (full batches,
    then a short last one) and, per step, (template, epoch, batch in the epoch), all 0-based."""

    def __init__(self, n_rows: int, batch_size: int, n_epochs: int) -> None:
        batches = batch_steps(n_rows, batch_size)
        self.rows = [rows for rows, _ in batches]
        self.schedule = [(t, times) for t, (_, times) in enumerate(batches)]
        self.n_epochs = n_epochs
        self.order = [(t, e, b) for e in range(n_epochs) for b, t in enumerate(
            [t for t, times in self.schedule for _ in range(times)])]


def _record_segment(initial: Sequence[Any], batches: Batches, steps: _Steps, segment: tuple[int, int],
                    record_step: Callable[[Any, int, list[tuple[int, int]]], None]) -> list[Any]:
    """A loop op running steps [first, first + n) of `steps` from the carried values `initial`; each template
    is recorded by `record_step(step, rows, runs)`: its batch rows and the (epoch, batch) of its runs in the
    segment. Returns the carried values after the segment."""
    loop = Loop(initial, batches)
    first, n = segment
    for t, rows in enumerate(steps.rows):
        runs = [(e, b) for tt, e, b in steps.order[first:first + n] if tt == t]
        with loop.step() as step:
            record_step(step, rows, runs)
    return loop.run(steps.schedule, rounds=steps.n_epochs, segment=segment)


def _record_replica(state: Sequence[Any], resident: Any, r: int, batches: Batches, steps: _Steps,
                    record_step: Callable[[Any, int, list[tuple[int, int]]], None]) -> list[Any]:
    """Replica r's loop over every step of the fit, its sync templates (`resident.sync_steps`) after every
    `resident.interval(r)` steps and the last one; returns all its carried values after the loop (its train state
    first)."""
    extra = resident.extra(r)
    loop = Loop(list(state) + extra, batches)
    n_state = len(state)
    for t, rows in enumerate(steps.rows):
        runs = [(e, b) for tt, e, b in steps.order if tt == t]
        with loop.step() as step:
            record_step(_StatePart(step, n_state), rows, runs)
    sync = resident.sync_steps(loop, r, n_state)
    return list(loop.run(steps.schedule, rounds=steps.n_epochs, sync=sync, sync_every=resident.interval(r),
                         close_after_s=resident.close_after_s))


class _StatePart:
    """A loop step seen by a training step that knows only the train state: the loop carries more values
    (a resident replica's global model and residuals), which the training step passes through."""

    def __init__(self, step: Step, n_state: int) -> None:
        self.step, self.n_state = step, n_state
        self.carried = step.carried[:n_state]

    def carry(self, values: Sequence[Any]) -> None:
        self.step.carry(list(values) + list(self.step.carried[self.n_state:]))

    def rows(self, data: Any, n_rows: int) -> Any:
        return self.step.rows(data, n_rows)

    def persist(self, op: Any, names: Sequence[str]) -> None:
        self.step.persist(op, names)


def _loss_name(epoch: int, batch: int) -> str:
    return training_loss_name(epoch + 1, batch + 1)


def _shard(data: Any, start: int, stop: int) -> Any:
    if isinstance(data, Op):
        return cast(Any, data)[start:stop]   # R's stub types an Op's slicing
    return as_input(torch.as_tensor(np.asarray(data) if not isinstance(data, torch.Tensor) else data)[start:stop])


class ParallelFit:
    """One fit under a strategy: the model, the data and the schedule, and the recordings a strategy picks."""

    def __init__(self, model: Any, X: Any, y: Any, n_epochs: int, batch_size: int, shuffle: bool, seed: int) -> None:
        self.model, self.X, self.y = model, X, y
        self.n_epochs, self.batch_size, self.shuffle, self.seed = n_epochs, batch_size, shuffle, seed
        self.loops: dict[str, list[int]] = {}   # role ('replica r') -> the loop op ids that run it, as recorded

    def _ran_as(self, role: str) -> None:
        """Note the loop op recorded last as one that runs `role`."""
        self.loops.setdefault(role, []).append(list(current_graph().loops)[-1])

    def gradient_replicas(self, strategy: Any) -> list[str]:
        """Per step: each replica's gradient of its slice (`strategy.slices(rows)`) in a one-step segment, then
        one optimizer step on their mean weighted by slice sizes (DataParallel)."""
        check_hooks(strategy, GradientReplicas)
        model, X, y = self.model, as_input(self.X), as_input(self.y)
        if not X.shape or not y.shape or X.shape[0] != y.shape[0]:
            raise ValueError(f"X and y must have the same number of rows, not shapes {tuple(X.shape)} and "
                             f"{tuple(y.shape)}")
        state = model.train_state(X)
        if state.buffers:
            raise NotImplementedError("DataParallel of a model with buffers (BatchNorm) is not implemented: each "
                                      "replica would see only its slice's batch statistics")
        steps = _Steps(X.shape[0], self.batch_size, self.n_epochs)
        batches = Batches(X.shape[0], self.batch_size, self.shuffle, self.seed)
        names: list[str] = []
        loss_shape = R.zeros(shape=(), dtype="float32")
        for index, (t, epoch, batch) in enumerate(steps.order):
            params = [slot.get() for slot in state.params]
            bounds = strategy.slices(steps.rows[t])
            replica_grads: list[list[Any]] = []
            replica_losses: list[Any] = []
            for start, stop in bounds:
                def gradient(step: Any, rows: int, runs: list[tuple[int, int]], start: int = start,
                             stop: int = stop) -> None:
                    loss = model.training_loss(step.rows(X, rows)[start:stop], step.rows(y, rows)[start:stop])
                    step.carry([*R.grad(loss, params), loss])

                # the segment carries the gradients and the loss: the parameters stand for their shapes at the start
                *grads, loss = _record_segment([*params, loss_shape], batches, steps, (index, 1), gradient)
                replica_grads.append(grads)
                replica_losses.append(loss)
            weights = [(stop - start) / steps.rows[t] for start, stop in bounds]
            weighted_sum(replica_losses, weights).persist_op(_loss_name(epoch, batch))
            names.append(_loss_name(epoch, batch))
            model.apply_gradients([weighted_sum(grads, weights) for grads in zip(*replica_grads)])
        return names

    def replicated(self, strategy: Any) -> list[str]:
        """Replicas training on disjoint shards from one initial model, each for the strategy's `segments`,
        synchronised after each by `strategy.synchronizer(initial, layout, graph_seed).exchange(...)`; the model
        after fit is its `finish(states)` (LocalSGD, Gossip, DiLoCo)."""
        check_hooks(strategy, ShardReplicas)
        X, y, model = self.X, self.y, self.model
        n_rows = as_input(X).shape[0] if isinstance(X, Op) else len(X)
        replicas = strategy.replicas
        per_update = strategy.update_frequency   # batches whose gradients one optimizer step sums
        sizes = strategy.shard_rows(n_rows, self.batch_size * per_update)
        bounds = np.cumsum([0] + sizes)
        shards = [(_shard(X, int(a), int(b)), _shard(y, int(a), int(b))) for a, b in zip(bounds, bounds[1:])]
        state = model.train_state(shards[0][0])
        slots, counters = state.carried, state.counters
        layout = Carried(len(state.params), len(state.buffers), len(state.optimizer))
        starts = [counter.get() for counter in counters]
        steps_of = [_Steps(size, self.batch_size * per_update, self.n_epochs) for size in sizes]
        # replica r's j-th batch of an epoch: batch j * replicas + r (equal shards), else the shards' batches in
        # replica order (the rows' order)
        equal = len(set(sizes)) == 1
        first_batch = [0] * replicas if equal else [int(a) // self.batch_size for a in bounds[:-1]]
        initial = [slot.get() for slot in slots]
        n_steps = len(steps_of[0].order)   # replica 0's (the resident sync reads it for Gossip's table: equal)
        names: dict[str, tuple[int, int]] = {}
        moved: dict[int, list[int]] = {}   # template -> how far its step moves each counter
        with_loss = strategy.needs_loss   # then a segment carries its last loss

        def train(r: int, X_shard: Any, y_shard: Any) -> Callable[[Any, int, list[tuple[int, int]]], None]:
            def record_step(step: Any, rows: int, runs: list[tuple[int, int]]) -> None:
                for counter, start in zip(counters, starts):
                    counter.set(start)
                for slot, value in zip(slots, step.carried):
                    slot.set(value)
                X_rows, y_rows = step.rows(X_shard, rows), step.rows(y_shard, rows)
                batch_losses = self._accumulated_step(X_rows, y_rows, rows, state) if per_update > 1 else \
                    [model.train_step(X_rows, y_rows)]
                step.carry([slot.get() for slot in slots] + batch_losses[-1:] * with_loss)
                for j, loss in enumerate(batch_losses):   # batch j of the step's: batch b * per_update + j
                    where = [(e, (b * per_update + j) * replicas + r if equal else first_batch[r] + b * per_update + j)
                             for e, b in runs]
                    run_names = [_loss_name(e, b) for e, b in where]
                    step.persist(loss, run_names)
                    names.update(zip(run_names, where))
                moved[rows] = [counter.get() - start for counter, start in zip(counters, starts)]
            return record_step

        def batches(r: int) -> Batches:
            return Batches(sizes[r], self.batch_size * per_update, self.shuffle, self.seed + r)

        def resident_replicas() -> tuple[list[list[Any]], list[int], Callable[[list[list[Any]]], Any]]:
            """One loop per replica for the whole fit, its state kept where it runs: (states, steps per round,
            finish)."""
            resident = check_hooks(strategy.resident_templates(initial, layout, n_steps, current_graph().seed),
                                   ResidentSync, "its resident sync")
            loss_slot = [R.zeros(shape=(), dtype="float32")] * with_loss
            states = [list(initial) for _ in range(replicas)]
            for r, (X_shard, y_shard) in enumerate(shards):
                states[r] = _record_replica(states[r] + loss_slot, resident, r, batches(r), steps_of[r],
                                            train(r, X_shard, y_shard))
                self._ran_as(f"replica {r}")
            return states, [resident.interval(r) for r in range(replicas)], resident.finish

        def segments() -> tuple[list[list[Any]], list[int], Callable[[list[list[Any]]], Any]]:
            """A loop op per replica and round, the synchronisation recorded between them as ops."""
            sync = check_hooks(strategy.synchronizer(initial, layout, current_graph().seed), Synchronizer,
                               "its synchronizer")
            loss_slot = [R.zeros(shape=(), dtype="float32")] * with_loss
            rounds = [strategy.segments(len(steps.order), r) for r, steps in enumerate(steps_of)]
            if len({len(runs) for runs in rounds}) > 1:
                raise ValueError(f"{strategy!r} gives its replicas {[len(runs) for runs in rounds]} runs between "
                                 "synchronisations: they must be as many")
            states = [list(initial) for _ in range(replicas)]
            losses: list[Any] = [None] * replicas
            for intervals in zip(*rounds):
                for r, (X_shard, y_shard) in enumerate(shards):
                    after = _record_segment(states[r] + loss_slot, batches(r), steps_of[r], intervals[r],
                                            train(r, X_shard, y_shard))
                    self._ran_as(f"replica {r}")
                    states[r], losses[r] = list(after[:len(slots)]), after[len(slots):]
                sync.exchange(states, losses, sum(intervals[0]))
            return states, [runs[0][1] for runs in rounds], sync.finish

        def record(form: str) -> list[Any]:
            states, per_round, finish = resident_replicas() if form == RESIDENT else segments()
            # what each replica contributes per round (History.contributions): its steps, their samples (a full
            # round's: an epoch's last batch may be short), its rounds
            current_graph().strategy_notes.rounds[repr(strategy)] = {
                f"replica {r}": {"steps_per_round": n, "samples_per_round": n * self.batch_size * per_update,
                                 "rounds": -(-len(steps_of[r].order) // n), "steps": len(steps_of[r].order)}
                for r, n in enumerate(per_round)}
            return list(finish(states))

        # resident replicas or segments: the same values; where the strategy leaves it open (resident=None), both
        # are recorded and the session picks at activation by its live workers (ravop/record/forms.py)
        final = record_forms(current_graph(), f"{strategy!r}'s replicas", replicas, strategy.resident_forms(),
                             record)
        for slot, value in zip(slots, final):
            slot.set(value)
        # the counters (the optimizer's step) as replica 0 advanced them: the model after fit is the global one
        for k, (counter, start) in enumerate(zip(counters, starts)):
            counter.set(start + sum(moved[steps_of[0].rows[t]][k] for t, _, _ in steps_of[0].order))
        return sorted(names, key=names.__getitem__)

    def _accumulated_step(self, X: Any, y: Any, rows: int, state: Any) -> list[Any]:
        """One optimizer step on the summed gradients of the step's batches (`update_frequency` of them, fewer in
        an epoch's last step), as torch sums `.grad` over backward calls; returns the batches' losses."""
        params = [slot.get() for slot in state.params]
        losses: list[Any] = []
        summed: Optional[list[Any]] = None
        for start in range(0, rows, self.batch_size):
            stop = min(start + self.batch_size, rows)
            losses.append(self.model.training_loss(X[start:stop], y[start:stop]))
            grads = R.grad(losses[-1], params)
            summed = grads if summed is None else [total + g for total, g in zip(summed, grads)]
        self.model.apply_gradients(summed)
        return losses

    def pipeline(self, strategy: Any) -> list[str]:
        """GPipe over the model's pipeline units (top-level layers or children) cut into the strategy's stages
        (Pipeline, ravdl/v2/pipeline_fit.py)."""
        check_hooks(strategy, PipelineStages)
        return record_pipeline(self.model, self.X, self.y, self.n_epochs, self.batch_size, self.shuffle, self.seed,
                               strategy, self.loops)
