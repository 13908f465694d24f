"""`Node`, the one record of an op after recording: what the compiler's IR holds, what a plan packs and a worker
unpacks and checks, and what the runner runs. Users hold `Op`s (ravop/record/graph.py); a `Node` is plain data.

`params` is the decoded dict, `pkey` the same params as wire JSON (hashable and exact: 1, 1.0 and True differ;
the plan reuses it); `dtype` a torch.dtype, `shape` a tuple (a tuple of each for a multi-output node; None and
() when not declared)."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from .registry import INPUT, op_of_kind

NO_PARAMS: dict[str, Any] = {}   # shared by every node without params


class Node:
    __slots__ = ("id", "op", "inputs", "params", "pkey", "shape", "dtype", "source")

    id: int
    op: str
    inputs: Sequence[int]
    params: dict[str, Any]
    pkey: bytes
    shape: Any      # a tuple of ints, or of shapes for a multi-output node
    dtype: Any      # a torch.dtype, a tuple of them, or None
    source: str

    def __init__(self, id: int, op: str, inputs: Sequence[int] = (), params: dict[str, Any] = NO_PARAMS,
                 pkey: bytes = b"", shape: Any = (), dtype: Any = None, source: str = "") -> None:
        self.id = id
        self.op = op            # registry name
        self.inputs = inputs    # node ids
        self.params = params
        self.pkey = pkey
        self.shape = shape
        self.dtype = dtype
        self.source = source    # the user's "file:line"

    def with_inputs(self, inputs: Sequence[int]) -> Node:
        return Node(self.id, self.op, inputs, self.params, self.pkey, self.shape, self.dtype, self.source)

    def as_constant(self) -> Node:
        return Node(self.id, op_of_kind(INPUT), (), NO_PARAMS, b"", self.shape, self.dtype, self.source)

    @property
    def multi_output(self) -> bool:
        return type(self.dtype) is tuple

    def __repr__(self) -> str:
        return f"<Node {self.id} {self.op} {list(self.inputs)} {self.shape} {self.dtype}>"


def node_of(op: Any, pkey: bytes = b"", inputs: Optional[Sequence[int]] = None) -> Node:
    """The `Node` of a recorded `Op` (ravop/record/graph.py; read by its fields, since core imports nothing of
    recording): the one conversion the compiler's IR, a loop step's template and in-process evaluation share.
    `pkey`: its params as wire JSON where a plan packs it (b"" where nothing goes on the wire); `inputs`: its
    input ids when the caller renames them (the Op's own by default)."""
    return Node(op.id, op.op, [i.id for i in op.inputs] if inputs is None else inputs, op.params or NO_PARAMS, pkey,
                op.shape, op.dtype, op.source)
