"""The op registry: one definition per op, the single source of truth for every side of the system.

An `OpDef` holds the op's name, its tensor inputs and keyword params, a shape/dtype rule (pure Python, run
when the op is recorded), the torch kernel (run by the worker) and the VJP rule (run by `R.grad`, which
records the backward ops). `R.<name>` functions and `Op` methods are generated from here
(`ravop.record.api`), and the worker dispatches on the same table.

Conventions an op definition follows:
- `inputs` names the tensor inputs in order. `"*xs"` (only as the single input) takes a list of tensors;
  a trailing `"b?"` is an optional tensor input that the caller may leave as `None`.
- `params` is a dict of keyword params and their defaults (`REQUIRED` for none). Params are stored inline
  in the op, canonicalised: lists become tuples, numpy scalars become Python numbers.
- `kernel(*tensors, **params)` returns a tensor, or a tuple of tensors for a multi-output op. A random op's
  kernel also receives `generator=` (a host `torch.Generator` seeded from the graph seed and the op).
- Devices: a kernel never names one. An op with no tensor inputs (`creates`: it makes its tensors from params)
  runs with the worker's device as torch's default device, so `torch.zeros(...)` lands there; a random op
  draws on the host generator and the runner moves what it returns to the device (the same numbers on a CPU
  and a GPU worker); any other kernel makes its helper tensors on its inputs' device (`device=x.device`).
  `tests/worker/execute/test_device.py` runs every op on a device other than the CPU and checks all of this.
- `shape(*inputs, **params)` sees the input `Op`s (their `.shape` and `.dtype`) and returns `(shape, dtype)`,
  or a list of them for a multi-output op. With `shape=None` the kernel itself is run on meta tensors.
- `vjp(node, grad, wants)` records the backward ops and returns one gradient `Op` (or `None`) per input;
  `grad` is an `Op`, or a list of `Op | None` for a multi-output op; `wants(op)` says whether the running
  `R.grad` needs a gradient w.r.t. input `op` (a rule may skip the others' work: ravop/ops/masked.py).
- `flops(shape, input_shapes, params)` (optional) estimates the op's floating-point operations from its
  output shape, its inputs' shapes and its params, for the compiler's cost model (`compiler.cost`), which
  otherwise uses the size of the largest tensor the op touches; shared rules are in `ravop.ops.flops`. It may
  return None for "no better estimate".
- `torch_function=(function, kwargs)` (optional): a TorchScript-able torch function equivalent to the op,
  called with the op's inputs (a variadic op's as one list) and `kwargs(op)`; a saved RavDL model's own
  forward code is exported as calls of these (`ravdl.v2.export`; helpers in `ravop.ops.scriptable`).
- `torch_module` (optional): the name of the `torch.nn` module computing the op, whose constructor takes the
  op's params (the softmax family's `axis` as `dim`): the ops RavDL's `Activation` layer offers.
- `operators` (optional): the Python operators an `Op` implements by recording the op (`"__add__"`; a reflected
  one, `"__radd__"`, records it with its operands swapped), made by `ravop.record.api`.
- `kind` marks the few ops the graph machinery makes itself (ravop/ops/graph_machinery.py), which are not `R.<op>`
  functions: INPUT (a value from the tensor store, not a kernel: constants), PROJECTION (output i of a
  multi-output node, its param `PICKS`; `Op.output(i)`), LOOP (a training loop run as a whole, `ravop.record.loop`;
  its param `LOOP_INDEX` says which of the graph's loops), HOLE (a value a loop's step reads) and LOOP_STOP (a
  step's decision to end its loop at the next epoch boundary: `ravop.record.loop.Step.stop_if`). Code asks an
  OpDef's flags (`is_input`, `is_projection`, `free`, ...) or, in hot loops, the name sets below, never an op's
  name.
- Flags a loop step reads (ravop.record.loop, ravop.runtime.loop_run, compiler/passes/loops.py), declared by the op
  so that no code matches op names or params' text: `counter` names the required int param that counts training steps
  (1-based, as torch.optim's `step`); `seed_param` names the int param that holds another op's stream seed
  (`op_seed(graph_seed, that op's id)`: dropout_backward redraws its forward's mask), which a loop step advances
  with that op's stream; `in_place` is an `InPlace` kernel doing the same update on the tensors it overwrites,
  for a loop that owns them (its carried values).
- Rewrites of a loop's step (ravop.runtime.step_compiler), declared by the ops they concern, each computing the
  op's own bits; `name` is what the step compiler counts them as. Each is made on a CPU only unless it says
  `cpu_only=False` (its bits were checked on CPU kernels only):
  `group_update` (a `GroupUpdate`): one call updating every tensor of the op's calls with the same settings (an
  optimizer step's foreach or fused kernel); `reuses` (a `Reuses`, on a backward op): what its forward computed in
  the same run is kept for it instead of being computed again (a dropout's mask, batch-norm statistics);
  `cpu_variant` (a `Variant`): a kernel giving the same bits faster on a CPU (max pooling on a channels-last copy).
- `reproducible`: the kernel the reproducible numerics mode runs (the same bits on every CPU class and thread count),
  None where the mode has none yet (the runner then refuses the op); set for all ops at once by
  ravop/ops/reproducible.py (`declare_reproducible`), the one table of which op runs which way.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import torch

REQUIRED: Any = object()  # default of a param the caller must give
INPUT, PROJECTION, LOOP, HOLE = "input", "projection", "loop_run", "hole"   # the kinds of `register(kind=...)`
LOOP_STOP = "ends_loop"   # ... and the op whose true value, persisted by a loop's step, ends the loop
PICKS, LOOP_INDEX = "index", "loop"   # the params of the PROJECTION op (which output) and the LOOP op (its loop)

Kernel = Callable[..., Any]


class InPlace(NamedTuple):
    """An op's update done in place: `kernel` takes the op's arguments and overwrites the inputs at
    `overwritten` (positions) instead of copying them."""
    kernel: Kernel
    overwritten: tuple[int, ...]


class GroupUpdate(NamedTuple):
    """The op's calls with the same settings run as one: `kernel(args, **params)` takes every member's arguments
    in turn (len(inputs) each) and their shared params (the step counter included) and returns each member's
    outputs, in order, each tensor updated on its own as the op updates it. `in_place`: it stands for the op's
    `in_place` variant (overwriting the same positions of every member), not for its kernel on copies;
    `covers(params)` (all params, defaults filled): whether it computes the op with these settings."""
    kernel: Kernel
    name: str
    in_place: bool = False
    covers: Optional[Callable[[dict[str, Any]], bool]] = None
    cpu_only: bool = True


class Reuses(NamedTuple):
    """A backward op's reuse of what its `forward` op computed in the same run of a step. The forward then runs
    `keeping(box, *its args, **its params)` (a random forward gets `generator=` too), which returns its outputs and
    leaves in `box` (a list, `[None]` at first, one per forward) what the backward needs; the backward runs
    `kept(box, *its args, **its params)`, which uses `box` where it holds this run's forward's and otherwise
    computes as the op. How a backward finds its forward: `reads`, (backward position, forward position) of a value
    both read (the latest such forward before it); a backward with a `seed_param` follows the forward whose random
    stream its seed is. `same`: params the two must have equal; `applies(params)` (the backward's, defaults
    filled): whether to make it; `box(params)` (the same params): the box to start from instead of `[None]`, where
    the forward must know what its (first) backward will ask (a VJP's mask: which inputs it differentiates)."""
    forward: str
    keeping: Kernel
    kept: Kernel
    name: str
    reads: tuple[tuple[int, int], ...] = ()
    same: tuple[str, ...] = ()
    applies: Optional[Callable[[dict[str, Any]], bool]] = None
    cpu_only: bool = True
    box: Optional[Callable[[dict[str, Any]], list[Any]]] = None


class Variant(NamedTuple):
    """A kernel giving the op's bits faster on a CPU, run there in a loop's step instead of the op's."""
    kernel: Kernel
    name: str


class OpDef:
    __slots__ = ("name", "inputs", "params", "kernel", "shape", "vjp", "random", "deterministic",
                 "method", "aliases", "flops", "torch_function", "torch_module", "kind", "variadic",
                 "n_required_inputs", "creates", "doc", "counter", "seed_param", "in_place", "group_update",
                 "reuses", "cpu_variant", "operators", "reproducible")

    name: str
    kernel: Kernel
    inputs: tuple[str, ...]
    params: dict[str, Any]
    random: bool
    deterministic: bool
    kind: Optional[str]
    creates: bool
    counter: Optional[str]
    seed_param: Optional[str]
    in_place: Optional[InPlace]
    group_update: Optional[GroupUpdate]
    reuses: Optional[Reuses]
    cpu_variant: Optional[Variant]
    operators: tuple[str, ...]
    reproducible: Optional[Kernel]

    def __init__(self, name: str, kernel: Kernel, inputs: tuple[str, ...], params: dict[str, Any],
                 shape: Optional[Callable[..., Any]], vjp: Optional[Callable[..., Any]], random: bool,
                 deterministic: bool, method: bool, aliases: tuple[str, ...], flops: Optional[Callable[..., Any]],
                 torch_function: Any, torch_module: Optional[str], kind: Optional[str], counter: Optional[str] = None,
                 seed_param: Optional[str] = None, in_place: Optional[InPlace] = None,
                 group_update: Optional[GroupUpdate] = None, reuses: Optional[Reuses] = None,
                 cpu_variant: Optional[Variant] = None, operators: tuple[str, ...] = ()) -> None:
        self.name = name
        self.kernel = kernel
        self.variadic = len(inputs) == 1 and inputs[0].startswith("*")
        self.inputs = tuple(i.lstrip("*").rstrip("?") for i in inputs)
        self.n_required_inputs = sum(1 for i in inputs if not i.endswith("?"))
        self.creates = not self.inputs  # makes its tensors from params alone (zeros, arange, random, ...)
        self.params = dict(params)
        self.shape = shape
        self.vjp = vjp
        self.random = random
        self.deterministic = deterministic and not random
        self.method = method
        self.aliases = tuple(aliases)
        self.flops = flops
        self.torch_function = torch_function
        self.torch_module = torch_module
        self.kind = kind
        self.doc = kernel.__doc__
        for flag, param in (("counter", counter), ("seed_param", seed_param)):
            if param is not None and param not in self.params:
                raise ValueError(f"op {name!r} declares {flag}={param!r}, which is not one of its params")
        self.counter, self.seed_param, self.in_place = counter, seed_param, in_place
        if group_update is not None and group_update.in_place and in_place is None:
            raise ValueError(f"op {name!r} groups its in-place variant but declares none")
        if reuses is not None and not reuses.reads and seed_param is None:
            raise ValueError(f"op {name!r} reuses its forward's values but says neither what both read nor a seed")
        self.group_update, self.reuses, self.cpu_variant = group_update, reuses, cpu_variant
        self.operators = tuple(operators)
        self.reproducible = None

    @property
    def differentiable(self) -> bool:
        return self.vjp is not None

    @property
    def is_input(self) -> bool:
        """Its value comes from the tensor store (a constant), not from a kernel."""
        return self.kind == INPUT

    @property
    def is_projection(self) -> bool:
        """It picks one output of a multi-output node."""
        return self.kind == PROJECTION

    @property
    def is_loop(self) -> bool:
        return self.kind == LOOP

    @property
    def free(self) -> bool:
        """It costs no work: a stored value, or one output of a tuple computed already."""
        return self.kind in (INPUT, PROJECTION)

    @property
    def internal(self) -> bool:
        """Made by the graph machinery, not by the user: no `R.<op>` function."""
        return self.kind is not None

    def __repr__(self) -> str:
        return f"OpDef({self.name!r})"


REGISTRY: dict[str, OpDef] = {}  # name (and alias) -> OpDef
# Names of the ops with a kind, for the loops that test every node (a set lookup, no OpDef to fetch);
# NOT_KERNELS: the ops a runner never calls (stored values, loops, a step's holes).
INPUTS: set[str] = set()
PROJECTIONS: set[str] = set()
LOOPS: set[str] = set()
HOLES: set[str] = set()
LOOP_STOPS: set[str] = set()
FREE: set[str] = set()
NOT_KERNELS: set[str] = set()
_OF_KIND: dict[str, str] = {}  # kind -> the name of the one op of that kind


def register(name: str, *, inputs: tuple[str, ...] = ("x",), params: Optional[dict[str, Any]] = None,
             shape: Optional[Callable[..., Any]] = None, vjp: Optional[Callable[..., Any]] = None,
             random: bool = False, deterministic: bool = True, method: bool = True, aliases: tuple[str, ...] = (),
             flops: Optional[Callable[..., Any]] = None, torch_function: Any = None,
             torch_module: Optional[str] = None, kind: Optional[str] = None, counter: Optional[str] = None,
             seed_param: Optional[str] = None, in_place: Optional[InPlace] = None,
             group_update: Optional[GroupUpdate] = None, reuses: Optional[Reuses] = None,
             cpu_variant: Optional[Variant] = None, operators: tuple[str, ...] = ()) -> Callable[[Kernel], Kernel]:
    """Decorator: register `kernel` as op `name`. See the module docstring for the conventions."""
    def decorate(kernel: Kernel) -> Kernel:
        opdef = OpDef(name, kernel, tuple(inputs), params or {}, shape, vjp, random, deterministic, method,
                      tuple(aliases), flops, torch_function, torch_module, kind, counter, seed_param, in_place,
                      group_update, reuses, cpu_variant, operators)
        for key in (name, *aliases):
            if key in REGISTRY:
                raise ValueError(f"op {key!r} is registered twice")
            REGISTRY[key] = opdef
        if kind is not None:
            if kind in _OF_KIND:
                raise ValueError(f"ops {_OF_KIND[kind]!r} and {name!r} are both of kind {kind!r}")
            _OF_KIND[kind] = name
            for names, flag in ((INPUTS, opdef.is_input), (PROJECTIONS, opdef.is_projection),
                                (LOOPS, opdef.is_loop), (HOLES, kind == HOLE), (LOOP_STOPS, kind == LOOP_STOP),
                                (FREE, opdef.free),
                                (NOT_KERNELS, kind in (INPUT, LOOP, HOLE))):
                if flag:
                    names.add(name)
        return kernel
    return decorate


def declare_reproducible(kernels: dict[str, Kernel]) -> None:
    """Set each named op's kernel of the reproducible numerics mode (op name -> kernel)."""
    for name, kernel in kernels.items():
        get(name).reproducible = kernel


def op_of_kind(kind: str) -> str:
    """The name of the op of `kind` (INPUT, PROJECTION, LOOP, HOLE, LOOP_STOP), for the code that makes such
    nodes."""
    return _OF_KIND[kind]


def get(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


def unique_opdefs() -> list[OpDef]:
    """Each OpDef once (aliases share their OpDef)."""
    return list({id(d): d for d in REGISTRY.values()}.values())


def meta_shape(opdef: OpDef, inputs: Any, params: dict[str, Any]) -> Any:
    """Shape rule of last resort: run the kernel on meta tensors (no data, no compute)."""
    metas = [torch.empty(i.shape, dtype=i.dtype, device="meta") for i in inputs]
    out = opdef.kernel(*metas, **params)
    if isinstance(out, (tuple, list)):
        return [(tuple(o.shape), o.dtype) for o in out]
    return tuple(out.shape), out.dtype
