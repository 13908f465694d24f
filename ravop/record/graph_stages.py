"""A PyTorch model cut into pipeline stages at any point of its graph, for a forward that is not a chain of its
children (those keep ravop/record/torchscript_stages.py's cuts and bits): residual connections, functional calls,
`size()` and `view`, a parameter read by two stages (a tied LM head).

The graph is torch.fx's symbolic trace of the nn.Module given to `R.model`, in train mode. Not torch.export:
export lowers to aten ops and functionalises BatchNorm (its buffers become outputs), while an fx graph keeps the
module's calls (`call_module` of `layer1.0.conv1`), so a stage built from a slice of it holds its parameters and
buffers under the full model's slot names, and the stage machinery trains it as it trains a chain's stage: a
TorchScript module (the slice scripted) of its own, on the full model's values picked by slot name.

The body's nodes, in forward order, may be cut before a node when every value that nodes after the cut read from
nodes before it is
- a floating tensor whose first dimension is the micro-batch's rows (checked on two micro-batch sizes): it crosses;
  all of them are packed into one (rows, n) tensor (each flattened after the rows, concatenated), since a stage
  hands one tensor to the next, which unpacks and clones them (an in-place op there, torchvision's
  `ReLU(inplace=True)`, must not write into its input, an autograd leaf of the stage's VJP);
- no tensor (a size, a device, a tuple of views): its node runs again after the cut, from values that cross;
- a parameter or buffer (`get_attr`): read again after the cut.
Units, the pieces Pipeline balances, run from one such cut to the next that leaves a parameter behind it; each is
measured on a micro-batch as chain units are: its parameters (first use; four times: value, gradient, two Adam
moments) and buffers, the activations autograd saves while its nodes run, and what crosses after it.
"""
import copy
import operator
import os
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import fx

from .torchscript_import import _from_module
from .torchscript_stages import NotAChain, stored_bytes

_TOLERANCE = dict(rtol=1e-5, atol=1e-6)
_TORCH_DIR = os.path.dirname(torch.__file__)


class NotTraceable(NotAChain):
    """The model cannot be traced by torch.fx, or its trace cannot be cut; names the construct and the user's line."""


def _user_line(exc: BaseException) -> str:
    """file:line (code) of the innermost frame of `exc` outside torch: the user's line that tracing failed on."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_TORCH_DIR)]
    return f"{frames[-1].filename}:{frames[-1].lineno} ({frames[-1].line})" if frames else "no line of the model"


def _traced(module: torch.nn.Module) -> fx.GraphModule:
    try:
        return fx.symbolic_trace(module)
    except Exception as exc:   # tracing runs the user's forward: any failure means "cannot cut this model"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise NotTraceable(f"Pipeline cannot trace {type(module).__name__} with torch.fx to cut it into stages: "
                           f"{first} at {_user_line(exc)}") from None


class _Recorder(fx.Interpreter):
    """Runs the graph, keeping each node's value and the tensors autograd saved while it ran."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[fx.Node, Any] = {}
        self.saved: dict[fx.Node, list[torch.Tensor]] = {}

    def run_node(self, n: fx.Node) -> Any:
        saved: list[torch.Tensor] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append(t)
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            value = super().run_node(n)
        self.values[n], self.saved[n] = value, saved
        return value


@dataclass
class Crossing:
    """What a cut before a body node hands on: the tensors packed (node, its shape after the rows), and the nodes
    run again after it, in forward order."""
    packed: list[tuple[fx.Node, tuple[int, ...]]]
    recomputed: list[fx.Node]

    def width(self) -> int:
        return sum(_numel(shape) for _, shape in self.packed)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass
class GraphCut:
    """A traced model's units: `memory` and `boundary` (bytes) as chain units', and per unit the body positions
    it covers; `stage(start, stop)` builds the stage module of units [start, stop)."""
    gm: fx.GraphModule
    body: list[fx.Node]
    result: fx.Node
    input: fx.Node
    at: dict[int, Crossing]   # body position -> the crossing of a cut before it
    bounds: list[tuple[int, int]] = field(default_factory=list)
    memory: list[int] = field(default_factory=list)
    boundary: list[int] = field(default_factory=list)
    out_shape: list[tuple[int, ...]] = field(default_factory=list)   # each unit's output shape after the rows

    def module(self, start: int, stop: int) -> fx.GraphModule:
        """Units [start, stop) as one GraphModule of one tensor in and one out (packed where a cut is)."""
        first, end = self.bounds[start][0], self.bounds[stop - 1][1]
        g, env = fx.Graph(), {}
        if first == 0:
            env[self.input] = g.placeholder(self.input.name)
        else:
            self._unpack(g, env, self.at[first])
        for n in self.body[first:end]:
            env[n] = g.node_copy(n, lambda x: env[x])
        if end == len(self.body):
            g.output(env[self.result])
        else:
            flat = [g.call_function(torch.flatten if shape else torch.unsqueeze, (env[n], 1))
                    for n, shape in self.at[end].packed]
            g.output(flat[0] if len(flat) == 1 else g.call_function(torch.cat, (flat,), {"dim": 1}))
        return fx.GraphModule(self.gm, g, self.gm.__class__.__name__)

    def _unpack(self, g: fx.Graph, env: dict, crossing: Crossing) -> None:
        packed = g.placeholder("packed")
        widths = [_numel(shape) for _, shape in crossing.packed]
        pieces = g.call_function(torch.split, (packed, widths), {"dim": 1}) if len(widths) > 1 else None
        for k, (n, shape) in enumerate(crossing.packed):
            piece = packed if pieces is None else g.call_function(operator.getitem, (pieces, k))
            env[n] = g.call_function(torch.clone, (g.call_function(torch.reshape, (piece, (-1, *shape))),))
        for n in crossing.recomputed:
            env[n] = g.node_copy(n, lambda x: env[x])


def _crossing(body: list[fx.Node], result: fx.Node, p: int, position: dict[fx.Node, int],
              first: dict[fx.Node, Any], second: dict[fx.Node, Any], rows: int) -> Optional[Crossing]:
    """The crossing of a cut before body[p], or None when a value read after it can be neither packed nor
    recomputed there (an integer tensor, one without the rows first, a module's non-tensor result)."""
    read = [x for n in body[p:] for x in n.all_input_nodes] + [result]
    packed: dict[fx.Node, tuple[int, ...]] = {}
    recomputed: dict[fx.Node, None] = {}   # an ordered set
    seen: set[fx.Node] = set()
    dtypes: set[torch.dtype] = set()
    while read:
        n = read.pop()
        if n in seen or position.get(n, -1) >= p:
            continue
        seen.add(n)
        value = first[n]
        if n.op == "get_attr":
            recomputed[n] = None
        elif isinstance(value, torch.Tensor):
            other = second[n]
            if not (value.is_floating_point() and value.dim() and value.shape[0] == rows and other.shape[0] == rows + 1
                    and value.shape[1:] == other.shape[1:] and _numel(value.shape[1:])):
                return None
            dtypes.add(value.dtype)
            packed[n] = tuple(value.shape[1:])
        elif n.op in ("call_function", "call_method"):
            recomputed[n] = None
            read.extend(n.all_input_nodes)
        else:
            return None
    if not packed or len(dtypes) > 1:
        return None
    order = lambda n: position.get(n, -1)   # noqa: E731
    return Crossing(sorted(packed.items(), key=lambda item: order(item[0])), sorted(recomputed, key=order))


def graph_cut(module: torch.nn.Module, sample: torch.Tensor, seed: int = 0) -> GraphCut:
    """The `GraphCut` of `module` (an nn.Module) measured on `sample` (one micro-batch); NotTraceable naming why
    when it cannot be traced or cut."""
    name = type(module).__name__
    gm = _traced(copy.deepcopy(module).train())
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    if len(inputs) != 1 or not isinstance(output.args[0], fx.Node):
        returned = "one value" if isinstance(output.args[0], fx.Node) else f"a {type(output.args[0]).__name__}"
        raise NotTraceable(f"{name}'s forward takes {len(inputs)} inputs and returns {returned}; Pipeline cuts a "
                           "forward of one tensor to one tensor")
    body = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    position = {n: k for k, n in enumerate(body)}
    params = [p.requires_grad_() for p in gm.parameters() if p.is_floating_point()]
    recorder = _Recorder(gm)
    rows = len(sample)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        whole = recorder.run(sample)
        with torch.no_grad():
            second = _Recorder(gm)
            second.run(torch.cat([sample, sample[:1]]))
    values = recorder.values
    cut = GraphCut(gm, body, output.args[0], inputs[0], {})
    for p in range(1, len(body)):
        crossing = _crossing(body, output.args[0], p, position, values, second.values, rows)
        if crossing is not None:
            cut.at[p] = crossing
    weights = {t.data_ptr() for t in params}
    owned: set = set()
    start, held, saved = 0, [], []
    for p, n in enumerate(body):
        held += _held(gm, n, owned)
        saved += [t for t in recorder.saved[n] if t.data_ptr() not in weights]
        ends = p + 1 == len(body) or (p + 1 in cut.at and any(t.requires_grad for t in held))
        if ends:
            crossing = cut.at.get(p + 1)
            out = values[output.args[0]]
            crossed = stored_bytes([values[m] for m, _ in crossing.packed] if crossing else [out])
            cut.bounds.append((start, p + 1))
            cut.memory.append(stored_bytes([t for t in held if t.requires_grad]) * 4 +
                              stored_bytes([t for t in held if not t.requires_grad]) + stored_bytes(saved) + crossed)
            cut.boundary.append(crossed)
            cut.out_shape.append((crossing.width(),) if crossing else tuple(out.shape[1:]))
            start, held, saved = p + 1, [], []
    if len(cut.bounds) < 2:
        raise NotTraceable(f"{name}'s graph has no cut that hands on only floating tensors of the micro-batch's "
                           "rows with a parameter on each side; Pipeline cannot cut it")
    _check_stages(cut, sample, whole, seed, name)
    return cut


def _held(gm: fx.GraphModule, n: fx.Node, owned: set) -> list[torch.Tensor]:
    """The parameters and buffers node `n` reads that no earlier node did (a tied one counts where first read)."""
    if n.op == "call_module":
        tensors = [*gm.get_submodule(n.target).parameters(), *gm.get_submodule(n.target).buffers()]
    elif n.op == "get_attr":
        tensors = [t for t in [operator.attrgetter(n.target)(gm)] if isinstance(t, torch.Tensor)]
    else:
        return []
    fresh = [t for t in tensors if id(t) not in owned]
    owned.update(id(t) for t in fresh)
    return fresh


def _check_stages(cut: GraphCut, sample: torch.Tensor, whole: torch.Tensor, seed: int, name: str) -> None:
    """The units run one by one as stages give the whole model's output (same seed, train mode): the trace
    missed nothing the forward does (fx records no Python side effects)."""
    x = sample
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for k in range(len(cut.bounds)):
            x = cut.module(k, k + 1)(x)
    if x.shape != whole.shape or not torch.allclose(x, whole.detach(), **_TOLERANCE):
        raise NotTraceable(f"{name}: its torch.fx trace cut into stages computes other values than the model; "
                           "Pipeline cannot cut it")


def stage_model(model: Any, cut: GraphCut, start: int, stop: int) -> tuple[Any, list[int], list[int]]:
    """(the `R.model` Model of units [start, stop) of `cut`, the full `model`'s parameter indices in its slot order,
    its buffer indices likewise), as torchscript_stages.stage_model."""
    with warnings.catch_warnings():   # fx's GraphModule annotates its attributes in __init__: not the user's to see
        warnings.filterwarnings("ignore", message="The TorchScript type system doesn't support instance-level",
                                category=UserWarning)
        stage = _from_module(cut.module(start, stop))
    param_index = {slot: k for k, slots in enumerate(model.param_slots) for slot in slots}
    buffer_index = {slot: k for k, slots in enumerate(model.buffer_slots) for slot in slots}
    return (stage, [param_index[slots[0]] for slots in stage.param_slots],
            [buffer_index[slots[0]] for slots in stage.buffer_slots])
