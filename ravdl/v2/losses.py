"""The losses a NeuralNetwork is configured with by name (both are ravop ops, as in the original API)."""
from typing import Any, Callable, Union

import ravop as R

Loss = Callable[..., Any]   # loss(y_true, y_pred) -> scalar Op

LOSSES: dict[str, Loss] = {"SquareLoss": R.square_loss, "CrossEntropy": R.cross_entropy_loss}


def get(name: Union[str, Loss]) -> Loss:
    """loss(y_true, y_pred) -> scalar Op for a loss name; a callable (a ravop loss such as R.square_loss, or
    the user's own of that signature) is its own loss."""
    if callable(name):
        return name
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; choose one of {', '.join(LOSSES)}") from None
