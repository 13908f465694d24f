"""The hand-written `R.<op>` functions, for the ops whose user-facing arguments are not canonical params: a dtype
in any spelling (`cast`), numpy's and the original's argument orders (`where`), an op name with its own keywords
(`foreach`), a numpy-style or string index (`index`, `set_value`), and the federated statistics, which take no
tensor and read the current federated graph. `ravop.record.api` makes them `R.<op>` instead of the generated
functions; each records through `graph.record` (the federated ones through `Graph.add_node`). They live here,
not beside their kernels in ravop.ops, so that a worker, which loads the kernels, never loads the recorder."""
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ..core import registry
from ..core.dtypes import NAMES, as_dtype
from ..core.errors import GraphStateError
from ..core.registry import get
from ..ops.federated_stats import PREFIX, STATISTICS, check_histogram, check_q
from .graph import NO_PARAMS, Op, as_flag, canonical, current_graph, record
from .index_spec import canonical_index
from .source import user_source


def cast_frontend(x, dtype):
    """`R.cast(x, 'float32')`, `x.astype(np.float32)`: any dtype spelling is stored as its name."""
    return record(get("cast"), (x,), {"dtype": NAMES[as_dtype(dtype)]})


def where(*args, condition=None, x=None, y=None):
    """`R.where(condition, x, y)`, numpy's order; the original API's `R.where(x, y, condition=c)` also works."""
    if condition is not None and len(args) == 2 and x is None and y is None:
        x, y = args
    elif len(args) + sum(v is not None for v in (condition, x, y)) == 3:
        named = iter(args)
        condition, x, y = (v if v is not None else next(named) for v in (condition, x, y))
    else:
        raise TypeError("where() takes a condition and two tensors: where(condition, x, y)")
    return record(get("where"), (condition, x, y), NO_PARAMS)


def foreach(x, operation, **params):
    """`R.foreach(x, operation='name', **params)`: the op's own keywords ride along as one param."""
    inner = registry.REGISTRY.get(operation) if isinstance(operation, str) else None
    if inner is not None:  # the original's string booleans become bools here, as for a direct call
        params = {k: as_flag(v, k, inner.name) if isinstance(inner.params.get(k), bool) else v
                  for k, v in params.items()}
    return record(registry.get("foreach"), (x,), {"operation": operation, "params": canonical(params)})


def index(x, indices):
    """`R.index(x, indices)` and `x[indices]`: record an `index` op for a numpy-style or string index."""
    spec, tensors = canonical_index(indices)
    return record(get("index"), (x, *tensors), {"spec": spec})


def set_value(x, value, indices):
    """`R.set_value(x, value, indices)`: x with x[indices] = value, as a new op."""
    spec, tensors = canonical_index(indices)
    return record(get("set_value"), (x, value, *tensors), {"spec": spec})


def _recorder(name: str, doc: Optional[str]) -> Callable[[], Op]:
    """`R.federated_<statistic>()`: one statistic of every rule column of the current federated graph, an `Op`
    of shape (columns,) that can be persisted."""
    def record() -> Op:
        graph = current_graph()
        graph.check_open()
        if graph.approach != "federated":
            raise GraphStateError(f"R.{name}() needs a federated graph: R.Graph(..., approach='federated', "
                                  f"rules=...), not the {graph.approach} graph {graph.name!r} (at {user_source()})")
        return graph.add_node(name, (), {}, (len(graph.rules.columns),), torch.float64, user_source())

    record.__name__ = record.__qualname__ = name
    record.__doc__ = doc
    return record


def _record_parameterised(name: str, op: str, params: Dict[str, Any], width: int) -> Op:
    graph = current_graph()
    graph.check_open()
    if graph.approach != "federated":
        raise GraphStateError(f"R.{name}() needs a federated graph: R.Graph(..., approach='federated', "
                              f"rules=...), not the {graph.approach} graph {graph.name!r} (at {user_source()})")
    return graph.add_node(op, (), params, (len(graph.rules.columns), width), torch.float64, user_source())


def record_quantile(q: Any) -> Op:
    """`R.federated_quantile(q)`: the q-quantile (q in [0, 1], or a list of them) of each rule column over the
    providers' data, from their merged KLL sketches (rank error ~0.7%); fetched as {column: float}, or
    {column: [float, ...]} for a list."""
    values, scalar = check_q(q)
    return _record_parameterised(PREFIX + "quantile", PREFIX + "quantile", {"q": values, "scalar": scalar},
                                 len(values))


def record_median() -> Op:
    """`R.federated_median()`: R.federated_quantile(0.5)."""
    return _record_parameterised(PREFIX + "median", PREFIX + "quantile", {"q": (0.5,), "scalar": True}, 1)


def record_histogram(bins: int = 10, range: Optional[Tuple[float, float]] = None) -> Op:
    """`R.federated_histogram(bins=10, range=None)`: per rule column, the providers' counts in `bins` equal bins
    over `range` (None: the rule's own [min, max]); a bin of fewer than k values is suppressed (None). Fetched as
    {column: {"edges": [...], "counts": [...]}}."""
    bins, limits = check_histogram(bins, range)
    return _record_parameterised(PREFIX + "histogram", PREFIX + "histogram", {"bins": bins, "range": limits}, bins)


FRONTENDS = {
    "cast": cast_frontend, "where": where, "foreach": foreach, "index": index, "set_value": set_value,
    **{PREFIX + statistic: _recorder(PREFIX + statistic, get(PREFIX + statistic).doc) for statistic in STATISTICS},
    PREFIX + "quantile": record_quantile, PREFIX + "median": record_median, PREFIX + "histogram": record_histogram,
}
