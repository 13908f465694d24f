"""Check a subgraph read from Redis before running any of it. A plan is data from the network, possibly
malformed or hostile: every op must be in the registry, every input defined before it is read, and the
memory its declared output shapes need at once must fit the worker's limit, so an absurd shape is refused
here instead of being allocated."""
from __future__ import annotations

from typing import Iterable

from ravop import registry
from ravop.errors import PlanError
from ravop.node import Node
from ravop.sizes import nbytes_estimate
from ravop.wire import plan_pb2, unpack_nodes

from .memory import dtype_name


class Program:
    """A checked subgraph: its steps (`ravop.node.Node`s, what `ravop.runner.Runner` runs), the size
    of each step's declared output (`declared`, by node id), the index of each value's last reader (outputs
    excluded, so they are kept), its outputs, and the peak bytes its declared shapes need."""
    __slots__ = ("steps", "declared", "last_use", "outputs", "peak_bytes")

    def __init__(self, steps: list[Node], declared: dict[int, int], last_use: dict[int, int], outputs: list[int],
                 peak_bytes: int) -> None:
        self.steps, self.declared, self.last_use = steps, declared, last_use
        self.outputs, self.peak_bytes = outputs, peak_bytes


def declared_bytes(node: Node) -> int:
    """Bytes of a step's declared output; 0 for a multi-output op (its tuple_get readers declare the parts)."""
    if node.dtype is None:
        return 0
    for d in node.shape:
        if d < -1:   # -1: a data-dependent size, not known before the run
            raise PlanError(f"op {node.op!r} declares a negative dimension in {tuple(node.shape)}", node)
    return nbytes_estimate(node.shape, node.dtype)


def check(subgraph: plan_pb2.Subgraph, max_bytes: int) -> Program:
    """The `Program` of a plan_pb2.Subgraph; `PlanError` (with the node at fault) if it cannot be run."""
    return check_nodes(unpack_nodes(subgraph.nodes), subgraph.inputs, subgraph.outputs, max_bytes)


def check_nodes(steps: list[Node], inputs: Iterable[int], outputs: Iterable[int], max_bytes: int) -> Program:
    """The `Program` of `steps` (decoded plan nodes) reading `inputs` and keeping `outputs`: a subgraph's, or a
    loop step's (its holes and the loop's inputs as `inputs`); `PlanError` (with the node at fault) if it
    cannot be run."""
    outputs = list(outputs)
    keep = set(outputs)
    defined = set(inputs)
    last_use: dict[int, int] = {}
    declared: dict[int, int] = {}
    known = registry.REGISTRY
    for index, step in enumerate(steps):
        node_id, op, reads = step.id, step.op, step.inputs
        if op not in known or op in registry.NOT_KERNELS and op not in registry.LOOPS:
            raise PlanError(f"unknown op {op!r}", step)   # a stored value or a hole is an input, not a step
        undefined = [i for i in reads if i not in defined]
        if undefined:
            raise PlanError(f"op {op!r} (node {node_id}) reads values {undefined}, which are neither inputs "
                            "nor computed before it", step)
        if node_id in defined:
            raise PlanError(f"node {node_id} is defined twice", step)
        defined.add(node_id)
        declared[node_id] = declared_bytes(step)
        for i in reads:
            if i not in keep:
                last_use[i] = index
    undefined = [o for o in outputs if o not in defined]
    if undefined:
        raise PlanError(f"outputs {undefined} are not computed by the subgraph")
    return Program(steps, declared, last_use, outputs, _peak_bytes(steps, declared, last_use, max_bytes))


def _peak_bytes(steps: list[Node], declared: dict[int, int], last_use: dict[int, int], max_bytes: int) -> int:
    """Most bytes alive at once, freeing each value after its last reader as the interpreter does."""
    live = peak = 0
    sizes = {}
    for index, step in enumerate(steps):
        size = sizes[step.id] = declared[step.id]
        live += size
        if live > peak:
            peak = live
            if peak > max_bytes:
                raise PlanError(f"the subgraph needs about {peak / 2**20:,.0f} MiB at op {step.op!r} (declared "
                                f"output {tuple(step.shape)} {dtype_name(step)}), over this worker's limit "
                                f"of {max_bytes / 2**20:,.0f} MiB (--max-subgraph-bytes)", step)
        for i in step.inputs:
            if last_use.get(i) == index:
                live -= sizes.pop(i, 0)   # pop: an op may read one value twice
    return peak
