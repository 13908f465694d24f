"""Sample inputs for the registry walk (tests/ops/test_registry_walk.py): every registered op needs at least one.

Each family module (tests/samples/<family>.py) defines `SAMPLES = {op_name: [Sample, ...]}`. The walk
records the op on the sample's inputs, runs it, and checks:
- the value against `reference(*inputs, **params)` (an independent numpy/torch implementation) when given,
  else against the op's own kernel run eagerly, and always the declared shape/dtype;
- for differentiable ops and `grad=True`: `R.grad` against `torch.autograd` through the op's kernel, in
  float64 with a tight tolerance.
"""
import dataclasses
import importlib
import pkgutil
from typing import Any, Callable, Optional


@dataclasses.dataclass
class Sample:
    inputs: tuple                       # tensors / arrays / numbers, in the op's input order
    params: dict = dataclasses.field(default_factory=dict)
    reference: Optional[Callable[..., Any]] = None   # independent implementation of the op
    grad: bool = True                   # gradient-check this sample (only if the op has a VJP)
    note: str = ""                      # what edge case this sample covers


def all_samples():
    """{op name: [Sample, ...]} merged from every family module in this package."""
    merged = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name, samples in getattr(module, "SAMPLES", {}).items():
            merged.setdefault(name, []).extend(samples)
    return merged
