"""`fit` as a loop (ravop.record.loop): one training step is recorded (two if the last batch is short, plus one
validation step), the data goes up once and each step slices its batch on the worker, so recording,
compiling and uploading a fit cost the same for 1 epoch or 100, and the worker keeps the model in memory.

A model trained this way gives its `TrainState` (`model.train_state(X)`: what a step carries and which Python
counters it advances) and records one step with `model.train_step(X, y)`; NeuralNetwork, Functional and
Pytorch_Model do, and R.parallel's strategies use the same interface (ravdl/v2/parallel_fit.py).
"""
from functools import partial
from typing import Any, Callable, Hashable, Optional, Sequence, cast

from ravop.core.loop_template import batch_steps
from ravop.core.loss_names import TRAINING_BATCH_RULE, VALIDATION_RULE, RunNames
from ravop.record.loop import Batches, Loop

from . import traps, trained_values
from .layers.base import as_input
from .loop_stopping import LoopStopping
from .optimizers import Optimizer


class Slot:
    """A place that holds an Op (or a Python counter): `container()[key]`, the container looked up each time
    (a layer may replace its dict of buffers)."""
    __slots__ = ("container", "key")

    def __init__(self, container: Callable[[], Any], key: Any) -> None:
        self.container, self.key = container, key

    def get(self) -> Any:
        return self.container()[self.key]

    def set(self, value: Any) -> None:
        self.container()[self.key] = value


class TrainState:
    """What a training step reads and replaces, as a model hands it to a fit loop or a strategy:
    - `params`: the trained parameters (what gradients are taken with respect to, what an optimizer steps);
    - `buffers`: every other model value a step replaces (BatchNorm statistics; frozen parameters are only read,
      so nothing carries them);
    - `optimizer`: the optimizer's state of `params` (moments), which stays with whoever runs the steps;
    - `counters`: the Python counters a step advances (optimizer step counts, BatchNorm batch counts).
    All but `counters` are `Slot`s holding Ops; `carried` is their concatenation, in that order."""
    __slots__ = ("params", "buffers", "optimizer", "counters")

    def __init__(self, params: list[Slot], buffers: list[Slot], optimizer: list[Slot], counters: list[Slot]) -> None:
        self.params, self.buffers, self.optimizer, self.counters = params, buffers, optimizer, counters

    @property
    def carried(self) -> list[Slot]:
        return self.params + self.buffers + self.optimizer


class LossTraining:
    """The training step every model kind records the same way, from its `loss_function`, `_forward_pass` and
    `_backward_pass` (part of the train-state interface the strategies use, docs/users/strategies.md)."""
    # the model's own, declared for the type checker
    loss_function: Optional[Callable[..., Any]]
    _forward_pass: Callable[..., Any]
    _backward_pass: Callable[..., Any]

    def training_loss(self, X: Any, y: Any) -> Any:
        """The loss (the one given to fit) of a training-mode forward pass of `X` against `y`, as an Op."""
        if self.loss_function is None:
            raise ValueError(f"{type(self).__name__} has no loss: give fit(..., loss='SquareLoss' | "
                             "'CrossEntropy' | a ravop loss)")
        loss = self.loss_function(as_input(y), self._forward_pass(X, training=True))
        traps.softmax_before_cross_entropy(self, loss)
        return loss

    def train_step(self, X: Any, y: Any) -> Any:
        """Record one training step on a batch; returns the loss Op (computed before the step)."""
        loss = self.training_loss(X, y)
        self._backward_pass(loss)
        return loss


def optimizer_slots(optimizer: Optimizer, params: Sequence[tuple[Hashable, Any]]) -> tuple[list[Slot], list[Slot]]:
    """(state slots, step count slots) of `optimizer` for `params`, (optimizer key, parameter Op) pairs; the
    state is made (zeros, step 0) for a parameter not stepped yet."""
    states = [optimizer.state_of(key, param) for key, param in params]
    return ([Slot(partial(_same, state), name) for state in states for name in optimizer.used_state()],
            [Slot(partial(_same, state), "step") for state in states])


def record_fit(model: Any, train_step: Callable[[Any, Any], Any], X: Any, y: Any, n_epochs: int, batch_size: int,
               shuffle: bool = False, seed: int = 0, validation: Optional[Callable[[], Any]] = None,
               stopping: Sequence[LoopStopping] = ()) -> RunNames:
    """Record `n_epochs` of `train_step(X_batch, y_batch) -> loss` over (X, y) in batches of `batch_size`;
    persists each loss as `ravop.core.loss_names.training_loss_name(e, b)` (by rule, `RunNames`: O(1) in the epochs), the carried values after the last
    step (`ravdl.v2.trained_values`) and, with `validation() -> loss` (recorded
    in eval mode after each epoch), `validation_loss_name(e)` (1-based). `stopping`: EarlyStopping rules decided
    in the loop at each epoch's end (ravdl.v2.loop_stopping). Returns the training loss names in order (a `RunNames`)."""
    if int(n_epochs) < 1:
        raise ValueError(f"n_epochs must be >= 1, not {n_epochs}")
    X, y = as_input(X), as_input(y)
    if not X.shape or not y.shape or X.shape[0] != y.shape[0]:
        raise ValueError(f"X and y must have the same number of rows, not shapes {tuple(X.shape)} and "
                         f"{tuple(y.shape)}")
    n_rows, batch_size, n_epochs = X.shape[0], int(batch_size), int(n_epochs)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, not {batch_size}")
    state = model.train_state(X)
    slots, counters = state.carried, state.counters
    starts = [counter.get() for counter in counters]
    rules = [(rule, len(rule.initial())) for rule in stopping]
    loop = Loop([slot.get() for slot in slots] + [value for rule in stopping for value in rule.initial()],
                Batches(n_rows, batch_size, shuffle, seed))
    n_slots = len(slots)
    epochs = range(1, n_epochs + 1)
    schedule: list[tuple[int, int]] = []
    steps_per_epoch = 0
    advance: Optional[list[Any]] = None
    first_batch = 1
    for rows, times in batch_steps(n_rows, batch_size):
        batches = range(first_batch, first_batch + times)
        first_batch += times
        for counter, start in zip(counters, starts):
            counter.set(start)
        with loop.step() as step:
            _bind(slots, step.carried)
            loss = train_step(step.rows(X, rows), step.rows(y, rows))
            step.carry([slot.get() for slot in slots] + [value for rule, values in _split(rules, step.carried[n_slots:])
                                                         for value in rule.after_batch(values, loss)])
            step.persist(loss, RunNames(TRAINING_BATCH_RULE, epochs, batches))
        moved = [counter.get() - start for counter, start in zip(counters, starts)]
        if advance is not None and moved != advance:
            raise ValueError("the short last batch's step advances the model's counters differently")
        advance = moved
        schedule.append((len(schedule), len(batches)))
        steps_per_epoch += len(batches)
    if validation is not None or rules:   # the epoch's end: its validation loss, the stopping rules' decisions
        with loop.step(counts=False) as step:
            _bind(slots, step.carried)
            validation_loss = validation() if validation is not None else None
            if validation_loss is not None:
                step.persist(validation_loss, RunNames(VALIDATION_RULE, epochs))
            step.carry([slot.get() for slot in slots] + [
                value for rule, values in _split(rules, step.carried[n_slots:])
                for value in rule.at_epoch_end(step, values, validation_loss, steps_per_epoch, epochs)])
        schedule.append((len(schedule), 1))
    _bind(slots, loop.run(schedule, rounds=n_epochs))
    trained_values.persist([slot.get() for slot in slots])   # where the next graph starts from
    for counter, start, moved in zip(counters, starts, cast(list[Any], advance)):   # Batches: n_rows >= 1
        counter.set(start + moved * steps_per_epoch * n_epochs)
    return RunNames(TRAINING_BATCH_RULE, epochs, range(1, first_batch))


def _split(rules: Sequence[tuple[LoopStopping, int]], values: Sequence[Any]) -> list[tuple[LoopStopping, list[Any]]]:
    """Each stopping rule with its share of the carried values after the model's (`rules`: rule, share size)."""
    shares, start = [], 0
    for rule, size in rules:
        shares.append((rule, list(values[start:start + size])))
        start += size
    return shares


def _bind(slots: Sequence[Slot], values: Sequence[Any]) -> None:
    for slot, value in zip(slots, values):
        slot.set(value)


def _same(value: Any) -> Any:
    return value
