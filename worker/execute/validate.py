"""Check a subgraph read from Redis before running any of it. A plan is data from the network, possibly
malformed or hostile: every op must be in the registry, every input defined before it is read, and the
memory its declared output shapes need at once must fit the worker's limit, so an absurd shape is refused
here instead of being allocated. A plain subgraph's structure is checked by building its runner
(`ravop.runtime.runner.Runner`), which the worker then runs: one pass over the ops builds and checks it."""
from __future__ import annotations

from typing import Any, Iterable, Optional

from ravop.core import registry
from ravop.core.errors import PlanError
from ravop.core.node import Node
from ravop.core.sizes import nbytes_estimate
from ravop.runtime.runner import Runner
from ravop.wire import unpack_nodes

from .memory import dtype_name


class Program:
    """A checked subgraph: its steps (`ravop.core.node.Node`s), the size of each step's declared output
    (`declared`, by node id; `limits`, in step order), the index of each value's last reader (outputs excluded,
    so they are kept), its outputs, the peak bytes its declared shapes need, and for a plain subgraph its
    `runner` (None for a loop subgraph, which worker/loops/loop_subgraph.py runs)."""
    __slots__ = ("steps", "limits", "_last_use", "outputs", "peak_bytes", "runner")

    def __init__(self, steps: list[Node], limits: list[int], last_use: Optional[dict[int, int]], outputs: list[int],
                 peak_bytes: int, runner: Optional[Runner] = None) -> None:
        self.steps, self.limits, self._last_use = steps, limits, last_use
        self.outputs, self.peak_bytes, self.runner = outputs, peak_bytes, runner

    @property
    def declared(self) -> dict[int, int]:
        return dict(zip([step.id for step in self.steps], self.limits))

    @property
    def last_use(self) -> dict[int, int]:
        if self._last_use is None and self.runner is not None:
            ids = list(self.runner.slot)   # in slot order
            self._last_use = {ids[s]: index for s, index in self.runner.freed.items()}
        return self._last_use or {}


def declared_bytes(node: Node) -> int:
    """Bytes of a step's declared output; 0 for a multi-output op (its tuple_get readers declare the parts)."""
    if node.dtype is None:
        return 0
    for d in node.shape:
        if d < -1:   # -1: a data-dependent size, not known before the run
            raise PlanError(f"op {node.op!r} declares a negative dimension in {tuple(node.shape)}", node)
    return nbytes_estimate(node.shape, node.dtype)


def check(subgraph: Any, max_bytes: int, device: str = "cpu", graph_seed: int = 0) -> Program:
    """The `Program` of a plan_pb2.Subgraph (typed Any: generated code), a plain one's runner built for
    `device` and `graph_seed`; `PlanError` (with the node at fault) if it cannot be run."""
    steps = unpack_nodes(subgraph.nodes)
    if subgraph.HasField("loop"):
        return check_nodes(steps, subgraph.inputs, subgraph.outputs, max_bytes)
    outputs = list(subgraph.outputs)
    runner = Runner(steps, subgraph.inputs, outputs, device, graph_seed)
    undefined = [o for o in outputs if o not in runner.slot]
    if undefined:
        raise PlanError(f"outputs {undefined} are not computed by the subgraph")
    known: dict[tuple, int] = {}   # (shape, dtype) -> bytes: most ops of a subgraph share a few sizes
    limits = []
    for step in steps:
        key = (step.shape, step.dtype)
        size = known.get(key)
        if size is None:
            size = known[key] = declared_bytes(step)
        limits.append(size)
    return Program(steps, limits, None, outputs, _runner_peak(runner, limits, max_bytes), runner)


def check_nodes(steps: list[Node], inputs: Iterable[int], outputs: Iterable[int], max_bytes: int) -> Program:
    """The `Program` of `steps` (decoded plan nodes) reading `inputs` and keeping `outputs`, without a runner: a
    loop subgraph's (its loop op and tuple_gets), or a loop step's (its holes and the loop's inputs as
    `inputs`); `PlanError` (with the node at fault) if it cannot be run."""
    outputs = list(outputs)
    keep = set(outputs)
    defined = set(inputs)
    last_use: dict[int, int] = {}
    limits: list[int] = []
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
        limits.append(declared_bytes(step))
        for i in reads:
            if i not in keep:
                last_use[i] = index
    undefined = [o for o in outputs if o not in defined]
    if undefined:
        raise PlanError(f"outputs {undefined} are not computed by the subgraph")
    return Program(steps, limits, last_use, outputs, _peak_bytes(steps, limits, last_use, max_bytes))


def _runner_peak(runner: Runner, limits: list[int], max_bytes: int) -> int:
    """`_peak_bytes` read from the runner's frees: the same count, without a dictionary per value."""
    live = peak = 0
    sizes = [0] * runner.n_inputs + limits
    for index, call in enumerate(runner.calls):
        live += limits[index]
        if live > peak:
            peak = live
            if peak > max_bytes:
                _too_big(runner.nodes[index], peak, max_bytes)
        for s in call[4]:
            live -= sizes[s]
    return peak


def _too_big(step: Node, peak: int, max_bytes: int) -> None:
    raise PlanError(f"the subgraph needs about {peak / 2**20:,.0f} MiB at op {step.op!r} (declared output "
                    f"{tuple(step.shape)} {dtype_name(step)}), over this worker's limit of {max_bytes / 2**20:,.0f} "
                    "MiB (--max-subgraph-bytes)", step)


def _peak_bytes(steps: list[Node], limits: list[int], last_use: dict[int, int], max_bytes: int) -> int:
    """Most bytes alive at once, freeing each value after its last reader as the runner does."""
    live = peak = 0
    sizes = {}
    for index, step in enumerate(steps):
        size = sizes[step.id] = limits[index]
        live += size
        if live > peak:
            peak = live
            if peak > max_bytes:
                _too_big(step, peak, max_bytes)
        for i in step.inputs:
            if last_use.get(i) == index:
                live -= sizes.pop(i, 0)   # pop: an op may read one value twice
    return peak
