"""`model.save(path)` and `load_model(path)`: a NeuralNetwork or Functional in a file with its trained values, to
predict, evaluate or train on in a later process as Keras' `model.save` / `keras.models.load_model` do.

The file is the model's pickle (its structure, as `pickle.dump(model)` keeps it) with every value read from the
store into a tensor at saving (`ravdl.v2.trained_values`), so loading needs no server and no graph; the graph
that trained the model must have run to its end when it is saved. Being a pickle, a model file runs code when
loaded, as `torch.load(weights_only=False)` does: load only files you trust.
"""
import copy
import pickle
from typing import Any

import torch

from . import trained_values
from .keras_habits import KerasHabits
from .layers.base import Place


def save(model: Any, path: str) -> None:
    """Write `model` with its current values to `path` (a GraphStateError if a value is not to be had yet)."""
    saved = copy.deepcopy(model)   # through __getstate__: places, not Ops; the model itself stays as it is
    for _, layer in saved.leaf_layers():
        if layer.places is not None:
            layer.places = tuple(_read(places) for places in layer.places)
    if saved.optimizer is not None:
        saved.optimizer.state = {slot: {name: value if name == "step" else
                                        trained_values.read(value, "saving the model")
                                        for name, value in state.items()}
                                 for slot, state in saved.optimizer.state.items()}
    with open(path, "wb") as f:
        pickle.dump(saved, f)


def load_model(path: str) -> Any:
    """The model `model.save(path)` wrote: its next forward pass, in any graph, starts from the saved values."""
    with open(path, "rb") as f:
        model = pickle.load(f)
    if not isinstance(model, KerasHabits):
        raise TypeError(f"{path} holds a {type(model).__name__}, not a model written by model.save(path)")
    return model


def _read(places: dict[str, Place]) -> dict[str, torch.Tensor]:
    return {key: trained_values.read(place, "saving the model") for key, place in places.items()}
