"""Cost model: FLOPs, bytes moved and estimated seconds per op, for partitioning and the plan summary.

seconds = dispatch overhead (a fixed part per op plus a part per tensor it reads or writes: layer-level
ops such as adam_step or linear_backward run several torch calls) + FLOPs / throughput + bytes / memory
bandwidth. Each worker measures its device's figures at start (worker/serve/calibrate.py) and advertises them;
`calibrated` takes the median of each device kind's workers. `DEVICES` holds the figures used where no worker
has advertised any: round numbers measured on ordinary hardware (a 2-core CPU runs a float32 matmul at
~1e11 FLOP/s, a large elementwise add at ~3-5 GB/s, relu on a small tensor in ~9 us and adam_step in ~45 us
through the runner); the partitioner only needs the right order of magnitude.

FLOPs come from the op's own `OpDef.flops(shape, input_shapes, params)` when it defines one (matmul-like ops
from their contracted dimension, convolutions from their kernel, sorts as n log n: `ravop.ops.flops`), else
from the largest tensor it touches (elementwise ops and reductions). Unknown (-1) dimensions count as 1.
"""
import statistics
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ravop.core import registry
from ravop.core.cost_fields import COST_FIELDS
from ravop.core.registry import FREE, LOOPS
from ravop.core.sizes import nbytes_estimate, numel_estimate

if TYPE_CHECKING:
    from ravop.core.loop_template import LoopRecord
    from ravop.core.node import Node

    from .ir import IR


class DeviceModel:
    """`handoff_bytes_per_s`: a tensor handed to another worker through Redis (encode, SET, GET, decode)."""
    __slots__ = ("op_s", "tensor_s", "flops_per_s", "bytes_per_s", "handoff_bytes_per_s")

    def __init__(self, op_s: float, tensor_s: float, flops_per_s: float, bytes_per_s: float,
                 handoff_bytes_per_s: float) -> None:
        self.op_s, self.tensor_s = op_s, tensor_s
        self.flops_per_s, self.bytes_per_s = flops_per_s, bytes_per_s
        self.handoff_bytes_per_s = handoff_bytes_per_s

    def seconds(self, n_tensors: int, flops: float, bytes: float) -> float:
        return self.op_s + n_tensors * self.tensor_s + flops / self.flops_per_s + bytes / self.bytes_per_s


DEVICES = {"cpu": DeviceModel(3e-6, 3e-6, 5e10, 5e9, 3e8), "cuda": DeviceModel(5e-6, 5e-6, 2e13, 1e12, 3e8)}


def calibrated(workers: Iterable[Mapping[str, Any]]) -> dict[str, DeviceModel]:
    """DEVICES with each kind's figures replaced by the median of those its workers advertised (`workers`:
    `ravop.store.worker_info.read_all`); a kind none of whose workers advertised figures keeps DEVICES'. The
    per-tensor dispatch cost is taken equal to the per-op one, as in DEVICES."""
    devices = dict(DEVICES)
    for kind in DEVICES:
        measured = [w for w in workers if w.get("kind") == kind and all(f in w for f in COST_FIELDS)]
        if measured:
            op_s, flops, bytes_, handoff = (statistics.median(w[f] for w in measured) for f in COST_FIELDS)
            devices[kind] = DeviceModel(op_s, op_s, flops, bytes_, handoff)
    return devices


def _out_bytes(node: "Node") -> int:
    if node.multi_output:
        return sum(map(nbytes_estimate, node.shape, node.dtype))
    return nbytes_estimate(node.shape, node.dtype)


def node_flops(node: "Node", nodes: Mapping[int, "Node"]) -> float:
    """Estimated floating-point operations of one node; `nodes` maps id -> Node for its inputs."""
    if node.op in FREE:
        return 0.0
    ins = [nodes[i].shape for i in node.inputs]
    rule = registry.REGISTRY[node.op].flops
    if rule is not None:
        flops = rule(node.shape, ins, node.params)
        if flops is not None:
            return float(flops)
    largest = numel_estimate(node.shape) if not node.multi_output else max(map(numel_estimate, node.shape), default=0)
    for shape in ins:
        n = numel_estimate(shape)
        if n > largest:
            largest = n
    return float(largest)


def node_seconds(node: "Node", nodes: Mapping[int, "Node"], model: DeviceModel = DEVICES["cpu"]) -> float:
    """Estimated seconds of one node on the device of `model`, on its own (`estimate` does every node at once)."""
    if node.op in FREE:
        return 0.0
    moved = _out_bytes(node) + sum(_out_bytes(nodes[i]) for i in node.inputs)
    n_tensors = len(node.inputs) + (len(node.shape) if node.multi_output else 1)
    return model.seconds(n_tensors, node_flops(node, nodes), moved)


class Costs:
    """Per-node estimates, as lists indexed by node id (ids are dense up to the recorded op count): seconds,
    FLOPs, bytes read and written, and bytes of the node's own output; and the device's hand-off rate."""
    __slots__ = ("seconds", "flops", "bytes", "out_bytes", "handoff_bytes_per_s")

    def __init__(self, seconds: list[float], flops: list[float], bytes: list[float], out_bytes: list[int],
                 handoff_bytes_per_s: float) -> None:
        self.seconds, self.flops, self.bytes, self.out_bytes = seconds, flops, bytes, out_bytes
        self.handoff_bytes_per_s = handoff_bytes_per_s


def loop_cost(record: "LoopRecord", loop_node: "Node", nodes: Mapping[int, "Node"],
              model: DeviceModel) -> tuple[float, float]:
    """(seconds, FLOPs) of a whole loop: each step template's ops priced as any subgraph's are, reading its holes
    and the loop op's inputs (`nodes`: id -> Node of the graph), times the runs of the step."""
    spec = record.spec
    outer = {name: nodes[i] for name, i in zip(spec.outer_ids, loop_node.inputs)}
    seconds = flops = 0.0
    for t, template in enumerate(spec.templates):
        known = {**outer, **template.holes}
        out_bytes: dict[int, int] = {}   # id -> bytes of its output, worked out once: most outputs are read again
        step_seconds = step_flops = 0.0
        for node in template.nodes:
            known[node.id] = node
            if node.op in FREE:
                continue
            f = node_flops(node, known)
            moved = out_bytes[node.id] = _out_bytes(node)
            for i in node.inputs:
                b = out_bytes.get(i)
                if b is None:
                    b = out_bytes[i] = _out_bytes(known[i])
                moved += b
            step_seconds += model.seconds(len(node.inputs) + (len(node.shape) if node.multi_output else 1), f, moved)
            step_flops += f
        runs = spec.runs(t)
        seconds += runs * step_seconds
        flops += runs * step_flops
    return seconds, flops


def estimate(ir: "IR", devices: Mapping[str, DeviceModel] = DEVICES) -> Costs:
    """Costs of every node of `ir` on its device (`devices`: kind -> DeviceModel). Constants and tuple_gets
    cost nothing."""
    model = devices[ir.device]
    size = ir.n_recorded
    seconds, flops, moved = [0.0] * size, [0.0] * size, [0.0] * size
    out_bytes = [0] * size
    nodes = ir.nodes
    estimate_seconds = model.seconds
    for id, node in nodes.items():
        b = out_bytes[id] = _out_bytes(node)
        if node.op in FREE:
            continue
        if node.op in LOOPS:
            seconds[id], flops[id] = loop_cost(ir.loops[id], node, nodes, model)
            continue
        for i in node.inputs:
            b += out_bytes[i]
        f = flops[id] = node_flops(node, nodes)
        moved[id] = b
        seconds[id] = estimate_seconds(len(node.inputs) + (len(node.shape) if node.multi_output else 1), f, b)
    return Costs(seconds, flops, moved, out_bytes, model.handoff_bytes_per_s)
