"""A subgraph's ops as `Node`s and as the columns plan.proto's `Nodes` carries them.

Columns because of the reader's cost: a worker reads every op of every subgraph it runs, and with a
message per op each field read builds a Python object (several microseconds per op, more than a small
kernel takes); a column converts to a list in one call. `unpack_nodes` checks that the columns agree with each
other, since a plan comes from the network.
"""
from __future__ import annotations

from typing import Any, Iterable

from ..core.dtypes import DTYPES, NAMES
from ..core.errors import PlanError
from ..core.node import NO_PARAMS, Node
from .codec import decode_params


def pack_nodes(rows: Iterable[Node], nodes: Any) -> None:
    """Append `rows` (`Node`s) to a plan_pb2.Nodes: params as their wire JSON (`pkey`), dtypes by name. A
    multi-output node declares no shape or dtype: its tuple_get readers declare the parts."""
    ids: list[int] = []
    ops: list[str] = []
    n_inputs: list[int] = []
    inputs: list[int] = []
    params: list[bytes] = []
    ranks: list[int] = []
    shapes: list[int] = []
    dtypes: list[str] = []
    sources: list[str] = []
    for row in rows:
        ids.append(row.id)
        ops.append(row.op)
        n_inputs.append(len(row.inputs))
        inputs.extend(row.inputs)
        params.append(row.pkey)
        dtype = row.dtype
        if dtype is None or type(dtype) is tuple:
            ranks.append(0)
            dtypes.append("")
        else:
            ranks.append(len(row.shape))
            shapes.extend(row.shape)
            dtypes.append(NAMES[dtype])
        sources.append(row.source)
    for column, values in ((nodes.id, ids), (nodes.op, ops), (nodes.n_inputs, n_inputs), (nodes.inputs, inputs),
                           (nodes.params, params), (nodes.rank, ranks), (nodes.shape, shapes),
                           (nodes.dtype, dtypes), (nodes.source, sources)):
        column.extend(values)


def unpack_nodes(nodes: Any) -> list[Node]:
    """The `Node`s of a plan_pb2.Nodes, params decoded (`pkey`: their wire bytes) and dtypes as torch dtypes;
    `PlanError` if the columns do not fit together, a params blob is not valid JSON or a dtype is unknown."""
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
    params_of = {b"": NO_PARAMS}   # most ops share a few params blobs (often empty): decode each once
    dtype_of = dict(DTYPES, **{"": None})
    rows, a, b = [], 0, 0
    for k, node_id in enumerate(ids):
        c, r = n_inputs[k], ranks[k]
        blob, name = params[k], dtypes[k]
        decoded, dtype = params_of.get(blob), dtype_of.get(name, name)
        if decoded is None or dtype is name:
            decoded, dtype = _checked(Node(node_id, ops[k], source=sources[k]), blob, name, params_of, dtype_of)
        rows.append(Node(node_id, ops[k], inputs[a:a + c], decoded, blob, tuple(shapes[b:b + r]), dtype, sources[k]))
        a += c
        b += r
    return rows


def _checked(node: Node, blob: bytes, name: str, params_of: dict[bytes, dict[str, Any]],
             dtype_of: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """(params, dtype) of a node whose params blob is new or whose dtype name is not known: `PlanError`
    naming `node` if either is bad."""
    if blob not in params_of:
        try:
            params_of[blob] = decode_params(blob)
        except ValueError as exc:
            raise PlanError(f"op {node.op!r}: {exc}", node) from None
    if name not in dtype_of:
        raise PlanError(f"op {node.op!r} declares unknown dtype {name!r}", node)
    return params_of[blob], dtype_of[name]
