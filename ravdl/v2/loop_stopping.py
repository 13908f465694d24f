"""EarlyStopping decided inside the fit's loop, at each epoch's end, where the losses are computed: the loop ends
at the next epoch boundary after the decision (`ravop.record.loop.Step.stop_if`), whatever the epoch rate. Its
callback on the requester (ravdl.v2.callbacks) still sees the same epochs and reaches the same decision; it no longer
asks the graph to stop, which a requester polling once a second did tens of epochs late on a fast model.

The rule as ops, one scalar each carried from epoch to epoch: `best` (the best value so far, as a minimum: the
monitored value times -1 in 'max' mode), `wait` (epochs since it improved) and, monitoring the training loss, the
sum of the epoch's batch losses (their mean is the epoch's `loss`, as History and the callbacks compute it). At an
epoch's end, as EarlyStopping.on_epoch_end: improved = current < best - min_delta; then best, wait; stop once
wait > patience. The decision of each epoch is persisted as `early_stopping_{k}_epoch_{e}` (k: the fit's k-th
EarlyStopping, e: the epoch, both from 1)."""
import math
from typing import Any, Optional, Sequence

import torch

import ravop as R

from .callbacks import Callback, EarlyStopping


class LoopStopping:
    """One EarlyStopping of a fit, recorded into its loop: `initial()` values join what the loop carries; each
    training step passes them through `after_batch`, the epoch's last step through `at_epoch_end`."""

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
                     [f"early_stopping_{self.index}_epoch_{e}" for e in epochs],
                     f"EarlyStopping: {rule.monitor} did not improve for {rule.patience + 1} epochs")
        return [best, wait] + [R.t(torch.tensor(0.0))] * self.on_loss


def of(callbacks: Sequence[Callback]) -> list[LoopStopping]:
    """The EarlyStopping callbacks of a fit, to record into its loop."""
    rules = [callback for callback in callbacks if isinstance(callback, EarlyStopping)]
    return [LoopStopping(rule, k) for k, rule in enumerate(rules, 1)]
