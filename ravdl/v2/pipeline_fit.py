"""Pipeline (GPipe) training of any model that gives pipeline units (`model.pipeline_units(sample, rows)`:
NeuralNetwork's top-level layers, a Pytorch_Model's top-level children or pieces of its traced graph;
ravdl/v2/pipeline_stages.py): per step, each stage's forward of each micro-batch, then each stage's backward (its
forward recomputed with the forward's dropout masks, its BatchNorm statistics updated by the forward only) from the
last stage to the first, one-step segments all; then one optimizer step on the micro-batches' gradients weighted by
their sizes. Resident stages (one loop per stage for the whole fit) are recorded by ravdl/v2/pipeline_resident.py;
with resident=None both are recorded and the session picks at activation (ravop/record/forms.py)."""
from typing import Any, Callable, Optional

import numpy as np
import torch

import ravop as R
from ravop.client.session import live_workers
from ravop.core.loop_template import batch_steps, round_orders
from ravop.core.errors import GraphStateError
from ravop.core.loss_names import training_loss_name
from ravop.parallel.pipeline import stage_seed
from ravop.parallel.replicas import weighted_sum
from ravop.record.forms import RESIDENT, SEGMENTS, record_forms
from ravop.record.graph import Op, current_graph
from ravop.record.loop import Loop

from .layers.base import as_input
from .pipeline_resident import record_resident_pipeline, resident_reason


def _one_step(initial: list[Any], record_step: Callable[[Any], None]) -> list[Any]:
    """A loop op of one step that reads no rows: its own subgraph, so a worker runs it apart from the others."""
    loop = Loop(initial)
    with loop.step() as step:
        record_step(step)
    return loop.run([(0, 1)])


def _advertising_workers() -> list[dict[str, Any]]:
    """The live workers of the graph's device kind (the ones the summary's forecast deals stages to) that advertise
    a subgraph memory limit: Pipeline(stages='auto') sizes its stages by them."""
    kind = "cuda" if current_graph().gpu_required else "cpu"
    workers = [w for w in live_workers() if w.get("memory_limit") and w.get("kind", kind) == kind]
    if not workers:
        raise GraphStateError(f"Pipeline(stages='auto') sizes its stages by the advertised memory of the {kind} "
                              "workers, and no live one advertises any: start the workers first, or give a number "
                              "of stages")
    return workers


def _steps(n_rows: int, batch_size: int, n_epochs: int) -> list[tuple[int, int]]:
    per_epoch = sum(times for _, times in batch_steps(n_rows, batch_size))
    return [(e, b) for e in range(n_epochs) for b in range(per_epoch)]


def _forms(strategy: Any, n_rows: int, batch_size: int, stages: list[Any]) -> list[str]:
    """The forms the stages are recorded in (ravop/record/forms.py): resident, segments, or both where
    `strategy.resident` is None and they can be resident, the session choosing at activation (resident when its
    live workers can hold every stage at once); resident=True where they cannot be is an error naming why."""
    if strategy.resident is False:
        return [SEGMENTS]
    slots = [slot for stage in stages for slot in stage.optimizer_slots()]
    reason = resident_reason(strategy, n_rows, batch_size) or (
        "a parameter is read by two stages (tied), and each resident stage would step its own copy"
        if len(set(slots)) < len(slots) else None)
    if reason is not None and strategy.resident:
        error = NotImplementedError if strategy.replicas > 1 else ValueError
        raise error(f"{strategy!r} cannot keep its stages resident: {reason}; use resident=None or False for "
                    "segments")
    return [SEGMENTS] if reason is not None else [RESIDENT] if strategy.resident else [RESIDENT, SEGMENTS]


def record_pipeline(model: Any, X: Any, y: Any, n_epochs: int, batch_size: int, shuffle: bool, seed: int,
                    strategy: Any, loops: Optional[dict[str, list[int]]] = None) -> list[str]:
    """Record the training of `model` under `strategy` (a Pipeline); returns the training loss names in order.
    `loops`: role -> the loop op ids that run it, filled for resident stages (the placement)."""
    if isinstance(X, Op) or isinstance(y, Op):
        raise TypeError("Pipeline takes X and y as arrays or tensors (each micro-batch is uploaded as it is cut)")
    X, y = np.asarray(X), np.asarray(y)
    if X.ndim < 1 or y.ndim < 1 or len(X) != len(y):
        raise ValueError(f"X and y must have the same number of rows, not shapes {X.shape} and {y.shape}")
    state = model.train_state(as_input(X[:1]))   # builds the layers; its checks: an optimizer, no gradients waiting
    micro_rows = max(stop - start for start, stop in strategy.micro_slices(min(batch_size, len(X))))
    units = model.pipeline_units(torch.as_tensor(X[:micro_rows]), micro_rows)
    if strategy.stages == "auto":
        strategy = strategy.fit_to_workers(units.memory, units.boundary, _advertising_workers())
        current_graph().strategy_notes.fits[-1] = strategy   # the summary's forecast names the stages chosen
    stages = [units.stage(start, stop) for start, stop in strategy.cut(units.memory)]
    names = [training_loss_name(epoch + 1, batch + 1) for epoch, batch in _steps(len(X), batch_size, n_epochs)]
    initial, starts = [slot.get() for slot in state.carried], [counter.get() for counter in state.counters]

    def record(form: str) -> list[Any]:
        for slot, value in zip(state.carried, initial):   # each form trains from the model before the fit
            slot.set(value)
        for counter, start in zip(state.counters, starts):
            counter.set(start)
        if form == RESIDENT:
            record_resident_pipeline(model, X, y, stages, strategy, n_epochs, batch_size, shuffle, seed, names,
                                     {} if loops is None else loops)
        else:
            _record_segments(model, X, y, stages, strategy, n_epochs, batch_size, shuffle, seed)
        return [slot.get() for slot in state.carried]

    record_forms(current_graph(), f"{strategy!r}'s stages", strategy.stages, _forms(strategy, len(X), batch_size, stages),
                 record)
    return names


def _record_segments(model: Any, X: Any, y: Any, stages: list[Any], strategy: Any, n_epochs: int, batch_size: int,
                     shuffle: bool, seed: int) -> None:
    """GPipe as one-step loop segments per (stage, micro-batch), forward and backward, and each step's update as
    ops, the losses persisted under their names."""
    graph_seed = current_graph().seed
    rounds = round_orders(len(X), shuffle, seed)
    orders = [np.arange(len(X)) if order is None else order for _, order in zip(range(n_epochs), rounds)]
    for index, (epoch, batch) in enumerate(_steps(len(X), batch_size, n_epochs)):
        rows = orders[epoch][batch * batch_size:(batch + 1) * batch_size]
        bounds = strategy.micro_slices(len(rows))
        weights = [(stop - start) / len(rows) for start, stop in bounds]
        grads: list[list[list[Any]]] = [[] for _ in stages]   # per stage, per micro-batch: its parameters' gradients
        losses: list[Any] = []
        for m, (start, stop) in enumerate(bounds):
            seeds = [lambda k, m=m, s=s: stage_seed(graph_seed, index, m, s, k) for s in range(len(stages))]
            inputs = [as_input(X[rows[start:stop]])]   # each stage's input
            read: list[list[Any]] = []                  # each stage's buffers before its forward
            for s, stage in enumerate(stages[:-1]):
                read.append(stage.buffers())

                def forward(step: Any, stage: Any = stage, a: Any = inputs[-1], buffers: list[Any] = read[-1],
                            seed: Callable[[int], int] = seeds[s]) -> None:
                    out, after = stage.forward(a, buffers, seed, counts=True)
                    step.carry([out, *after])

                shape = (stop - start,) + tuple(stage.out_shape)
                out, *after = _one_step([R.zeros(shape=shape, dtype="float32"), *read[-1]], forward)
                stage.set_buffers(after)
                inputs.append(out)
            read.append(stages[-1].buffers())
            target = as_input(y[rows[start:stop]])
            g_out: Any = None
            for s in range(len(stages) - 1, -1, -1):
                stage, last = stages[s], s == len(stages) - 1
                wrt = stage.params() + inputs[s:s + 1] * (s > 0)
                if not wrt and not last:   # a first stage without trained parameters: no gradient to take
                    grads[s].append([])
                    continue

                def backward(step: Any, stage: Any = stage, a: Any = inputs[s], wrt: list[Any] = wrt, last: bool = last,
                             g_out: Any = g_out, buffers: list[Any] = read[s], seed: Callable[[int], int] = seeds[s],
                             takes_input: bool = s > 0) -> None:
                    if takes_input:   # the input as the step's hole: differentiated apart from the stages before,
                        a = step.carried[len(wrt) - 1]   # which may read a parameter of this one (a tied head)
                        wrt = [*wrt[:-1], a]
                    out, after = stage.forward(a, buffers, seed, counts=last)
                    if last:   # the last stage's forward runs here only: its statistics are kept
                        loss = model.loss_function(target, out)
                        step.carry([*R.grad(loss, wrt), loss, *after])
                    else:      # a recompute: its statistics are the forward segment's, already kept
                        step.carry(R.grad(out, wrt, grad_output=g_out))

                extra = [R.zeros(shape=(), dtype="float32"), *read[s]] if last else []
                stage_grads = list(_one_step(wrt + extra, backward))
                if last:
                    stage.set_buffers(stage_grads[len(wrt) + 1:])
                    losses.append(stage_grads[len(wrt)])
                    stage_grads = stage_grads[:len(wrt)]
                g_out = stage_grads.pop() if s > 0 else None
                grads[s].append(stage_grads)
        weighted_sum(losses, weights).persist_op(training_loss_name(epoch + 1, batch + 1))
        for (stage, k), per_stage in _by_parameter(stages, grads).items():
            per_micro = [sum((g[m] for g in per_stage[1:]), per_stage[0][m])
                         for m in range(len(weights))]
            stage.apply(k, weighted_sum(per_micro, weights))


def _by_parameter(stages: list[Any], grads: list[list[list[Any]]]) -> dict[tuple[Any, int], list[list[Any]]]:
    """(the first stage that trains a parameter, its index there) -> per stage training it, the parameter's gradient
    of each micro-batch: a parameter two stages read (a tied LM head and embedding) is stepped once, on the sum."""
    merged: dict[Any, tuple[tuple[Any, int], list[list[Any]]]] = {}
    for stage, stage_grads in zip(stages, grads):
        for k, slot in enumerate(stage.optimizer_slots()):
            merged.setdefault(slot, ((stage, k), []))[1].append([per_micro[k] for per_micro in stage_grads])
    return dict(merged.values())
