"""`R.federated_mean()` and its siblings: record one statistic of every rule column of the current federated
graph. Each is an `Op` (so it can be persisted), of shape (columns,); it runs nowhere but on the providers."""
import torch

from ..errors import GraphStateError
from ..graph import current_graph
from ..source import user_source
from .session import PREFIX
from .stats import STATISTICS


def _statistic(name):
    def record():
        graph = current_graph()
        graph.check_open()
        if graph.approach != "federated":
            raise GraphStateError(f"R.{PREFIX}{name}() needs a federated graph: R.Graph(..., approach='federated', "
                                  f"rules=...), not the {graph.approach} graph {graph.name!r} (at {user_source()})")
        return graph.add_node(PREFIX + name, (), {}, (len(graph.rules.columns),), torch.float64, user_source())

    record.__name__ = record.__qualname__ = PREFIX + name
    record.__doc__ = (f"The {name.replace('_', ' ')} of each rule column over the data of the graph's providers, "
                      "filtered by the rules; fetched as {column: float}.")
    return record


federated_mean, federated_variance, federated_standard_deviation, federated_min, federated_max, federated_count = (
    _statistic(name) for name in STATISTICS)
