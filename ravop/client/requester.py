"""What `import ravop as R` offers a requester: sessions, graph recording, the generated `R.<op>` functions,
`R.model`, gradients, losses and federated statistics. ravop/__init__.py loads it on first use of one of its
names, so that a worker, which needs only the registry, the op kernels, the store and the wire format, never does.
"""
from .. import ops  # noqa: F401  (importing ops fills the registry)
from .. import parallel  # noqa: F401  (R.parallel.LocalSGD, ...)
from ..core import op_functions
from ..core.errors import (
    ConnectionFailed, DeviceUnavailable, GraphCancelledError, GraphFailedError, GraphStateError, NotComputedError,
    RavopError, ShapeError, StoreLimitError, UnknownPersistName)
from ..core.spot_policy import Verify
from ..record.api import build as _build
from ..record.autodiff import NotDifferentiableError, grad
from ..record.constants import Scalar, Tensor, epsilon, inf, minus_one, one, pi, t
from ..record.graph import Graph, Op, current_graph
from ..record.torchscript_import import model
from .activation import activate
from .fetching import fetch_losses, fetch_persisting_op
from .session import flush, initialize
from .tracking import execute, get_my_graphs, track_progress
from .training_losses import Losses

_functions = _build(op_functions.__dict__)
globals().update({name: getattr(op_functions, name) for name in dir(op_functions) if not name.startswith("_")})

# The names ravop/__init__.py takes over: the imported API and the generated op functions.
PUBLIC = {name: value for name, value in globals().items() if not name.startswith("_") and name != "PUBLIC"}
