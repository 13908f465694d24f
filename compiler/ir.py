"""The compiler's IR: the recorded graph as a table of small immutable nodes, built once in O(n).

Nodes keep the ids they were recorded with, so ascending id order is always a topological order (passes
only remove nodes, point readers at an earlier node, or turn a node into a constant in place). Passes never
mutate a node or an IR: they build new ones and share what they did not change, so the recorded graph and
every intermediate IR stay valid.
"""
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ravop.core.errors import GraphStateError
from ravop.core.loop_template import LoopRecord
from ravop.core.node import NO_PARAMS, Node, node_of
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


def from_graph(graph: "Graph", forms: Optional[Sequence[str]] = None) -> IR:
    """The IR of a recorded `ravop.record.graph.Graph` (which is only read). `forms`: the form that runs of each part
    recorded in several (`graph.strategy_notes.forms`, ravop/record/forms.py), in order; None: the last recorded of
    each."""
    dropped, alias, outputs = _chosen_forms(graph, forms)
    nodes: dict[int, Node] = {}
    # Params repeat (an optimizer's settings on every step, a layer's options on every call): encode each
    # distinct set once. Canonical params are numbers, strings, None and tuples, whose repr is exact.
    encoded: dict[str, bytes] = {}
    steps = graph.step_ids
    for op in graph.nodes:
        if op.id in steps or op.id in dropped:
            continue   # ops of a loop step (the loop's template carries them), or of a form that does not run
        params = op.params or NO_PARAMS
        pkey = b""
        if params:
            text = repr(params)
            known = encoded.get(text)
            if known is None:
                known = encoded[text] = encode_params(params)
            pkey = known
        inputs = tuple([i.id for i in op.inputs] if not alias else [alias.get(i.id, i.id) for i in op.inputs])
        if steps and not steps.isdisjoint(inputs):
            raise GraphStateError(f"op {op.op!r} at {op.source} reads a value recorded inside a loop step, which "
                                  "has one value per run of the step: read the loop's results instead")
        nodes[op.id] = node_of(op, pkey, inputs)
    if graph.recording_step is not None:
        raise GraphStateError("a loop step is still being recorded: finish it and run the loop first")
    run = {i for record in graph.loops.values() for template in record.spec.templates
           for i in (o.node for o in template.outputs)}
    unrun = {op.id: op for op in graph.step_outputs.ops() if op.id not in run}
    if unrun:
        op = next(iter(unrun.values()))
        raise GraphStateError(f"the loop step that recorded {op.op!r} at {op.source} was never run: call "
                              "loop.run(...)")
    # The plan carries the seed as uint64. Random streams only depend on it modulo 2**64
    # (`ravop.runtime.evaluate.op_seed`), so a negative graph seed keeps its streams.
    seed = graph.seed & 0xFFFF_FFFF_FFFF_FFFF
    constants = dict(graph.constants) if not dropped else \
        {id: value for id, value in graph.constants.items() if id not in dropped}
    loops = dict(graph.loops) if not dropped else \
        {id: record for id, record in graph.loops.items() if id not in dropped}
    return IR(nodes, outputs, constants, seed, graph.id, "cuda" if graph.gpu_required else "cpu", len(graph.nodes),
              loops)


def _chosen_forms(graph: "Graph", forms: Optional[Sequence[str]]) -> tuple[set[int], dict[int, int], dict[str, int]]:
    """(ids of the forms that do not run, {result of a last form: the chosen form's}, persist name -> id) of
    `graph` with `forms` chosen (None: the last of each part, which is what later ops read as recorded)."""
    outputs = {name: op.id for name, op in graph.persisted.items()}
    parts = graph.strategy_notes.forms
    if forms is None:
        forms = [part.last for part in parts]
    if len(forms) != len(parts):
        raise ValueError(f"graph {graph.name!r} records {len(parts)} parts in several forms, and {len(forms)} "
                         "choices were given")
    dropped: set[int] = set()
    alias: dict[int, int] = {}
    for part, name in zip(parts, forms):
        if name not in part.forms:
            raise ValueError(f"{part.what} are recorded as {' or '.join(part.forms)}, not {name!r}")
        for other, form in part.forms.items():
            if other != name:
                dropped.update(range(form.start, form.stop))
        if name != part.last:   # later ops read the last form's results: the chosen form's instead
            last, chosen = part.forms[part.last], part.forms[name]
            alias.update(zip(last.results, chosen.results))
            outputs = {n: id for n, id in outputs.items() if n not in last.persisted}
            outputs.update(chosen.persisted)
    if alias:
        outputs = {n: alias.get(id, id) for n, id in outputs.items()}
    return dropped, alias, outputs

