"""EarlyStopping and TerminateOnNaN decided inside the fit's loop, at each epoch's end, where the losses are
computed: the loop ends at the next epoch boundary after the decision (`ravop.record.loop.Step.stop_if`), whatever
the epoch rate. Their callbacks on the requester (ravdl.v2.callbacks) still see the same epochs and reach the same
decision; they no longer ask the graph to stop, which a requester polling once a second did hundreds of epochs late
on a fast model.

Each rule is a few scalar ops carried from epoch to epoch. EarlyStopping: `best` (the best value so far, as a
minimum: the monitored value times -1 in 'max' mode), `wait` (epochs since it improved) and, monitoring the
training loss, the sum of the epoch's batch losses (their mean is the epoch's `loss`, as History and the callbacks
compute it); at an epoch's end, as EarlyStopping.on_epoch_end: improved = current < best - min_delta; then best,
wait; stop once wait > patience. TerminateOnNaN: whether a batch loss of the epoch was NaN or infinite. The decision
of each epoch is persisted as `early_stopping_{k}_epoch_{e}` or `terminate_on_nan_{k}_epoch_{e}` (k: the fit's
k-th such callback, e: the epoch, both from 1)."""
import math
from typing import Any, Optional, Sequence

import torch

import ravop as R

from ravop.core.loss_names import RunNames

from .callbacks import Callback, EarlyStopping, TerminateOnNaN


class LoopStopping:
    """A stopping callback of a fit, recorded into its loop: `initial()` values join what the loop carries; each
    training step passes them through `after_batch`, the epoch's end step through `at_epoch_end`."""

    def initial(self) -> list[Any]:
        raise NotImplementedError

    def after_batch(self, values: Sequence[Any], loss: Any) -> list[Any]:
        raise NotImplementedError

    def at_epoch_end(self, step: Any, values: Sequence[Any], validation_loss: Optional[Any], steps_per_epoch: int,
                     epochs: range) -> list[Any]:
        raise NotImplementedError


class EarlyStoppingInLoop(LoopStopping):
    def __init__(self, rule: EarlyStopping, index: int) -> None:
        self.rule, self.index = rule, index
        self.on_loss = rule.monitor == "loss"
        rule.in_loop = True   # its callback leaves the stop to the loop

    def initial(self) -> list[Any]:
        scalars = [math.inf, 0.0] + [0.0] * self.on_loss   # best, wait (, sum of the epoch's batch losses)
        return [R.t(torch.tensor(value, dtype=torch.float32)) for value in scalars]

    def after_batch(self, values: Sequence[Any], loss: Any) -> list[Any]:
        if not self.on_loss:
            return list(values)
        best, wait, total = values
        return [best, wait, total + R.cast(loss, "float32")]

    def at_epoch_end(self, step: Any, values: Sequence[Any], validation_loss: Optional[Any], steps_per_epoch: int,
                     epochs: range) -> list[Any]:
        rule = self.rule
        best, wait = values[0], values[1]
        current = values[2] / float(steps_per_epoch) if self.on_loss else R.cast(validation_loss, "float32")
        current = current * rule.sign
        improved = R.less(current, best - rule.min_delta)
        best, wait = R.where(improved, current, best), R.where(improved, 0.0, wait + 1.0)
        step.stop_if(R.greater(wait, float(rule.patience)),
                     RunNames(f"early_stopping_{self.index}_epoch_{{e}}", epochs),
                     f"EarlyStopping: {rule.monitor} did not improve for {rule.patience + 1} epochs")
        return [best, wait] + [R.t(torch.tensor(0.0))] * self.on_loss


class TerminateOnNaNInLoop(LoopStopping):
    def __init__(self, rule: TerminateOnNaN, index: int) -> None:
        self.index = index
        rule.in_loop = True

    def initial(self) -> list[Any]:
        return [R.t(torch.tensor(False))]   # a batch loss of this epoch was NaN or infinite

    def after_batch(self, values: Sequence[Any], loss: Any) -> list[Any]:
        not_finite = R.logical_or(R.not_equal(loss, loss), R.equal(R.abs(loss), math.inf))
        return [R.logical_or(values[0], not_finite)]

    def at_epoch_end(self, step: Any, values: Sequence[Any], validation_loss: Optional[Any], steps_per_epoch: int,
                     epochs: range) -> list[Any]:
        step.stop_if(values[0], RunNames(f"terminate_on_nan_{self.index}_epoch_{{e}}", epochs),
                     "TerminateOnNaN: training loss not finite in this epoch")
        return [R.t(torch.tensor(False))]


def of(callbacks: Sequence[Callback]) -> list[LoopStopping]:
    """The EarlyStopping and TerminateOnNaN callbacks of a fit, to record into its loop."""
    early = [callback for callback in callbacks if isinstance(callback, EarlyStopping)]
    nan = [callback for callback in callbacks if isinstance(callback, TerminateOnNaN)]
    return ([EarlyStoppingInLoop(rule, k) for k, rule in enumerate(early, 1)] +
            [TerminateOnNaNInLoop(rule, k) for k, rule in enumerate(nan, 1)])
