"""The backward pass both model kinds record (`Model`, `Pytorch_Model`): gradients summed over backward calls,
as torch accumulates `.grad`, then one optimizer step per parameter.

A parameter is a slot `(owner, key)` whose current value is `owner.params[key]` (a layer's dict of values,
or a Pytorch_Model's list); the slot also keys the optimizer's state for that parameter."""
from typing import Any

import ravop as R

from .optimizers import Optimizer


def backward(loss: R.Op, slots: list[tuple[Any, Any]], pending: dict[tuple[Any, Any], R.Op], optimizer: Optimizer,
             step: bool) -> None:
    """Record `R.grad(loss, ...)` for every slot and add each gradient to `pending` (slot -> gradient Op); with
    `step`, record one `optimizer.update` per pending slot, which becomes the parameter's value, and empty
    `pending`."""
    grads = R.grad(loss, [owner.params[key] for owner, key in slots])
    for slot, grad in zip(slots, grads):
        summed = pending.get(slot)
        pending[slot] = grad if summed is None else summed + grad
    if step:
        for (owner, key), grad in pending.items():
            owner.params[key] = optimizer.update((owner, key), owner.params[key], grad)
        pending.clear()
