"""Op definitions, one module per family; importing this package fills the registry."""
from . import graph_machinery, arithmetic  # noqa: F401
from . import nn, activations, loss_functions, optim  # noqa: F401  (layer-level ops, their backward ops, optimizer steps)
from . import (kernel_vjp, linalg, shape, reduce, compare, indexing, gather, join, creation, sorting,  # noqa: F401
               stats, random, foreach, cast)  # the original Ravop's non-layer op set
from . import federated_stats  # noqa: F401  (a provider's partial and the statistics released from partials)
from . import torchscript  # noqa: F401  (TorchScript models recorded by R.model)
from . import step_table  # noqa: F401  (per-step values of a loop: Gossip's pairs, learning rate schedules)
from . import reproducible  # noqa: F401  (last: each op's kernel of the reproducible numerics mode)
