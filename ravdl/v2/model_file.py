"""`model.save(path)` and `load_model(path)`: a NeuralNetwork or Functional in a file with its trained values, to
predict, evaluate or train on in a later process as Keras' `model.save` / `keras.models.load_model` do.

The file is the model's pickle (its structure, as `pickle.dump(model)` keeps it) with every value read from the
store into a tensor at saving (`ravdl.v2.trained_values`), so loading needs no server and no graph; the graph
that trained the model must have run to its end when it is saved. Loading admits only what a model file holds
(ravdl's classes and functions, ravop's classes and op functions, tensors and their storages, dtypes, numpy arrays, builtin containers): a pickle that
names any other callable (os.system, eval, ...) is refused with an UnpicklingError before anything runs.
"""
import copy
import io
import pickle
from typing import Any

import numpy
import torch

from ravop.core import registry

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
        model = _ModelUnpickler(f).load()
    if not isinstance(model, KerasHabits):
        raise TypeError(f"{path} holds a {type(model).__name__}, not a model written by model.save(path)")
    return model


def _read(places: dict[str, Place]) -> dict[str, torch.Tensor]:
    return {key: trained_values.read(place, "saving the model") for key, place in places.items()}


# What a model file may name besides ravdl's and ravop's own classes (torch's tensor pickling, numpy's arrays)
_BUILTINS = {kind.__name__ for kind in (set, frozenset, slice, complex, range, bytearray)}
_FUNCTIONS = {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
              ("torch._utils", "_rebuild_tensor"), ("collections", "OrderedDict"), ("collections", "Counter"),
              ("collections", "defaultdict"), ("collections", "deque"),
              ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
              ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
              ("numpy", "ndarray"), ("numpy", "dtype"), ("copyreg", "_reconstructor")}


def _storage_from_bytes(data: bytes) -> Any:
    """What torch.storage._load_from_bytes does, with torch's weights-only unpickler instead of a plain one."""
    return torch.load(io.BytesIO(data), weights_only=True)


class _ModelUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        package = module.split(".")[0]
        if (module, name) == ("torch.storage", "_load_from_bytes"):   # a tensor's storage: torch's own safe loader
            return _storage_from_bytes
        if (module, name) in _FUNCTIONS or (module == "builtins" and name in _BUILTINS):
            return super().find_class(module, name)
        found = super().find_class(module, name) if package in ("ravdl", "ravop", "torch", "numpy") else None
        if (package in ("ravdl", "ravop") and isinstance(found, type)) or package == "ravdl" \
                or (module == "ravop" and name in registry.REGISTRY):   # a layer's loss or activation: an R.<op>
            return found
        if package == "torch" and (isinstance(found, (torch.dtype, torch.device)) or
                                   (isinstance(found, type) and name.endswith("Storage"))):
            return found
        if package == "numpy" and isinstance(found, type) and issubclass(found, numpy.dtype):
            return found
        raise pickle.UnpicklingError(f"a model file may not name {module}.{name}: not written by model.save(path)")
