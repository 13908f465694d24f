"""A subgraph's ops as rows (`NodeRow`) and as the columns plan.proto's `Nodes` carries them.

Columns because of the reader's cost: a worker reads every op of every subgraph it runs, and with a
message per op each field read builds a Python object (several microseconds per op, more than a small
kernel takes); a column converts to a list in one call. `unpack_nodes` checks that the columns agree with each
other, since a plan comes from the network.
"""
from ..errors import PlanError


class NodeRow:
    """One op of a plan: id, op name, input ids, params (JSON bytes), declared shape and dtype, source line."""
    __slots__ = ("id", "op", "inputs", "params", "shape", "dtype", "source")

    def __init__(self, id, op, inputs=(), params=b"", shape=(), dtype="", source=""):
        self.id, self.op, self.inputs, self.params = id, op, list(inputs), params
        self.shape, self.dtype, self.source = tuple(shape), dtype, source

    def __repr__(self):
        return f"NodeRow({self.id}, {self.op!r}, inputs={self.inputs}, shape={self.shape}, dtype={self.dtype!r})"


def pack_nodes(rows, nodes):
    """Append `rows` (NodeRow-like: .id .op .inputs .params .shape .dtype .source) to a plan_pb2.Nodes."""
    ids, ops, n_inputs, inputs, params, ranks, shapes, dtypes, sources = [], [], [], [], [], [], [], [], []
    for row in rows:
        ids.append(row.id)
        ops.append(row.op)
        n_inputs.append(len(row.inputs))
        inputs.extend(row.inputs)
        params.append(row.params)
        ranks.append(len(row.shape))
        shapes.extend(row.shape)
        dtypes.append(row.dtype)
        sources.append(row.source)
    for column, values in ((nodes.id, ids), (nodes.op, ops), (nodes.n_inputs, n_inputs), (nodes.inputs, inputs),
                           (nodes.params, params), (nodes.rank, ranks), (nodes.shape, shapes),
                           (nodes.dtype, dtypes), (nodes.source, sources)):
        column.extend(values)


def unpack_nodes(nodes, row=NodeRow):
    """The rows of a plan_pb2.Nodes, each `row(id, op, inputs, params, shape, dtype, source)` (a NodeRow or
    a subclass); `PlanError` if the columns do not fit together."""
    ids, ops, n_inputs, params = list(nodes.id), list(nodes.op), list(nodes.n_inputs), list(nodes.params)
    ranks, dtypes, sources = list(nodes.rank), list(nodes.dtype), list(nodes.source)
    inputs, shapes = list(nodes.inputs), list(nodes.shape)
    n = len(ids)
    lengths = {"op": len(ops), "n_inputs": len(n_inputs), "params": len(params), "rank": len(ranks),
               "dtype": len(dtypes), "source": len(sources)}
    uneven = {name: length for name, length in lengths.items() if length != n}
    if uneven:
        raise PlanError(f"the plan's node columns disagree: {n} ids but column lengths {uneven}")
    if sum(n_inputs) != len(inputs):
        raise PlanError(f"the plan's nodes declare {sum(n_inputs)} inputs in all but list {len(inputs)}")
    if sum(ranks) != len(shapes):
        raise PlanError(f"the plan's nodes declare {sum(ranks)} shape dimensions in all but list {len(shapes)}")
    rows, a, b = [], 0, 0
    for k, node_id in enumerate(ids):
        c, r = n_inputs[k], ranks[k]
        rows.append(row(node_id, ops[k], inputs[a:a + c], params[k], shapes[b:b + r], dtypes[k], sources[k]))
        a += c
        b += r
    return rows
