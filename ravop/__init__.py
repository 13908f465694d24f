"""ravop: record lazy tensor ops, compile them to subgraphs and run them on workers through Redis.

    import ravop as R
    R.initialize()
    R.Graph(name='demo')
    c = R.t([1, 2, 3]) + R.t([4, 5, 6])
    c.persist_op('c')
    R.activate(); R.execute(); R.track_progress()
    R.fetch_persisting_op('c')
"""
import gc as _gc

from . import functional, ops  # noqa: F401  (importing ops fills the registry)
from . import parallel  # noqa: F401  (R.parallel.LocalSGD, ...)
from .api import build as _build
from .autodiff import NotDifferentiableError, grad
from .constants import Scalar, Tensor, epsilon, inf, minus_one, one, pi, t
from .errors import (ConnectionFailed, DeviceUnavailable, GraphFailedError, GraphStateError, NotComputedError,
                     RavopError, ShapeError, StoreLimitError, UnknownPersistName)
from .federated.api import (federated_count, federated_max, federated_mean, federated_min,
                            federated_standard_deviation, federated_variance)
from .graph import Graph, Op, current_graph
from .model import model
from .session import (activate, execute, fetch_persisting_op, flush, get_my_graphs, initialize,
                      track_progress)
from .training_losses import Losses, fetch_losses

_functions = _build(functional.__dict__)
globals().update({name: getattr(functional, name) for name in dir(functional) if not name.startswith("_")})

# Recording allocates one tracked object per op; without this, each full garbage collection would also walk
# the hundreds of thousands of objects torch creates at import, doubling the cost of recording an op.
_gc.freeze()
