"""Initial values of layer parameters, drawn on the requester as the torch modules draw them.

Each layer gets its own `torch.Generator`, seeded from the graph seed (`R.Graph(..., seed=...)`, default 0)
and the layer's position among the layers built in that graph, so a script builds the same model every run
and two layers (or two models) never draw the same numbers.
"""
import math
import weakref
from typing import Any, Sequence

import torch
from torch.nn import init

from ravop.runtime.evaluate import op_seed

_SALT = 0x5EED_1A7E   # keeps layer seeds apart from the seeds random ops draw for the same positions
# graph -> number of layers built in it so far
_built: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def layer_seed(graph_seed: int, position: int) -> int:
    """The seed of the layer built `position`-th (from 0) in a graph with seed `graph_seed`."""
    return op_seed(graph_seed ^ _SALT, position)


def layer_generator(graph: Any) -> torch.Generator:
    """A generator for the next layer built in `graph`."""
    position = _built.get(graph, 0)
    _built[graph] = position + 1
    return torch.Generator().manual_seed(layer_seed(graph.seed, position))


def kaiming_uniform(shape: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """nn.Linear's and nn.Conv2d's weight init: kaiming_uniform_(w, a=sqrt(5))."""
    return init.kaiming_uniform_(torch.empty(shape), a=math.sqrt(5), generator=generator)


def fan_in_uniform(shape: Sequence[int], weight: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """nn.Linear's and nn.Conv2d's bias init: uniform in +-1/sqrt(fan_in) of the weight."""
    fan_in, _ = init._calculate_fan_in_and_fan_out(weight)
    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
    return init.uniform_(torch.empty(shape), -bound, bound, generator=generator)


def normal(shape: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """nn.Embedding's init: standard normal."""
    return init.normal_(torch.empty(shape), generator=generator)


def given(value: Any, shape: Sequence[int], what: str) -> torch.Tensor:
    """A user-given initial value (torch's parameter layout) as a float32 tensor of the expected shape."""
    tensor = torch.as_tensor(value).detach().to(torch.get_default_dtype()).clone()
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{what} must have shape {tuple(shape)} (torch's layout), not {tuple(tensor.shape)}")
    return tensor
