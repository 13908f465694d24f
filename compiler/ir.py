"""The compiler's IR: the recorded graph as a table of small immutable nodes, built once in O(n).

Nodes keep the ids they were recorded with, so ascending id order is always a topological order (passes
only remove nodes, point readers at an earlier node, or turn a node into a constant in place). Passes never
mutate a node or an IR: they build new ones and share what they did not change, so the recorded graph and
every intermediate IR stay valid.
"""
from typing import TYPE_CHECKING, Any

from ravop.core.errors import GraphStateError
from ravop.core.loop_template import LoopRecord
from ravop.core.node import NO_PARAMS, Node
from ravop.wire.codec import encode_params

if TYPE_CHECKING:
    from ravop.record.graph import Graph


class IR:
    """`nodes`: id -> Node in ascending id order; `outputs`: persist name -> id; `constants`: id -> tensor for
    every const node; `loops`: loop node id -> its `ravop.core.loop_template.LoopRecord` (the ops of its steps are not
    in `nodes`: they are its templates' `Node`s)."""
    __slots__ = ("nodes", "outputs", "constants", "seed", "graph_id", "device", "n_recorded", "loops")

    def __init__(self, nodes: dict[int, Node], outputs: dict[str, int], constants: dict[int, Any], seed: int,
                 graph_id: Any, device: str, n_recorded: int, loops: dict[int, LoopRecord] | None = None) -> None:
        self.nodes = nodes
        self.outputs = outputs
        self.constants = constants
        self.seed = seed
        self.graph_id = graph_id
        self.device = device
        self.n_recorded = n_recorded
        self.loops = loops or {}

    def roots(self) -> list[int]:
        """The ids everything live is needed for: persisted outputs, and loops (their steps persist values)."""
        return list(self.outputs.values()) + [id for id in self.loops if id in self.nodes]

    def replace(self, **changes: Any) -> "IR":
        fields = {name: getattr(self, name) for name in IR.__slots__}
        fields.update(changes)
        return IR(**fields)


def from_graph(graph: "Graph") -> IR:
    """The IR of a recorded `ravop.record.graph.Graph` (which is only read)."""
    nodes: dict[int, Node] = {}
    # Params repeat (an optimizer's settings on every step, a layer's options on every call): encode each
    # distinct set once. Canonical params are numbers, strings, None and tuples, whose repr is exact.
    encoded: dict[str, bytes] = {}
    steps = graph.step_ids
    for op in graph.nodes:
        if op.id in steps:
            continue   # ops of a loop step: the loop's template carries them
        params = op.params or NO_PARAMS
        pkey = b""
        if params:
            text = repr(params)
            known = encoded.get(text)
            if known is None:
                known = encoded[text] = encode_params(params)
            pkey = known
        inputs = tuple([i.id for i in op.inputs])
        if steps and not steps.isdisjoint(inputs):
            raise GraphStateError(f"op {op.op!r} at {op.source} reads a value recorded inside a loop step, which "
                                  "has one value per run of the step: read the loop's results instead")
        nodes[op.id] = Node(op.id, op.op, inputs, params, pkey, op.shape, op.dtype, op.source)
    outputs = {name: op.id for name, op in graph.persisted.items()}
    if graph.recording_step is not None:
        raise GraphStateError("a loop step is still being recorded: finish it and run the loop first")
    run = {i for record in graph.loops.values() for template in record.spec.templates
           for i in template.output_nodes}
    unrun = {op.id: op for op in graph.step_outputs.ops() if op.id not in run}
    if unrun:
        op = next(iter(unrun.values()))
        raise GraphStateError(f"the loop step that recorded {op.op!r} at {op.source} was never run: call "
                              "loop.run(...)")
    # The plan carries the seed as uint64. Random streams only depend on it modulo 2**64
    # (`ravop.runtime.evaluate.op_seed`), so a negative graph seed keeps its streams.
    seed = graph.seed & 0xFFFF_FFFF_FFFF_FFFF
    return IR(nodes, outputs, dict(graph.constants), seed, graph.id,
              "cuda" if graph.gpu_required else "cpu", len(graph.nodes), dict(graph.loops))

