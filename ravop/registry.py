"""The op registry: one definition per op, the single source of truth for every side of the system.

An `OpDef` holds the op's name, its tensor inputs and keyword params, a shape/dtype rule (pure Python, run
when the op is recorded), the torch kernel (run by the worker) and the VJP rule (run by `R.grad`, which
records the backward ops). `R.<name>` functions and `Op` methods are generated from here
(`ravop.api`), and the worker dispatches on the same table.

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
  `tests/test_device.py` runs every op on a device other than the CPU and checks all of this.
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
- `kind` marks the few ops the graph machinery makes itself (ravop/ops/core.py), which are not `R.<op>`
  functions: INPUT (a value from the tensor store, not a kernel: constants), PROJECTION (output i of a
  multi-output node; `Op.output(i)`), LOOP (a training loop run as a whole, `ravop.loop`) and HOLE (a value a
  loop's step reads). Code asks an OpDef's flags (`is_input`, `is_projection`, `free`, ...) or, in hot loops,
  the name sets below, never an op's name.
"""
import torch

REQUIRED = object()  # default of a param the caller must give
INPUT, PROJECTION, LOOP, HOLE = "input", "projection", "loop_run", "hole"   # the kinds of `register(kind=...)`


class OpDef:
    __slots__ = ("name", "inputs", "params", "kernel", "shape", "vjp", "random", "deterministic",
                 "method", "aliases", "flops", "torch_function", "torch_module", "kind", "variadic",
                 "n_required_inputs", "creates", "doc")

    def __init__(self, name, kernel, inputs, params, shape, vjp, random, deterministic, method, aliases, flops,
                 torch_function, torch_module, kind):
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

    @property
    def differentiable(self):
        return self.vjp is not None

    @property
    def is_input(self):
        """Its value comes from the tensor store (a constant), not from a kernel."""
        return self.kind == INPUT

    @property
    def is_projection(self):
        """It picks one output of a multi-output node."""
        return self.kind == PROJECTION

    @property
    def is_loop(self):
        return self.kind == LOOP

    @property
    def free(self):
        """It costs no work: a stored value, or one output of a tuple computed already."""
        return self.kind in (INPUT, PROJECTION)

    @property
    def internal(self):
        """Made by the graph machinery, not by the user: no `R.<op>` function."""
        return self.kind is not None

    def __repr__(self):
        return f"OpDef({self.name!r})"


REGISTRY = {}  # name (and alias) -> OpDef
# Names of the ops with a kind, for the loops that test every node (a set lookup, no OpDef to fetch).
INPUTS, PROJECTIONS, LOOPS, FREE = set(), set(), set(), set()
_OF_KIND = {}  # kind -> the name of the one op of that kind


def register(name, *, inputs=("x",), params=None, shape=None, vjp=None, random=False, deterministic=True,
             method=True, aliases=(), flops=None, torch_function=None, torch_module=None, kind=None):
    """Decorator: register `kernel` as op `name`. See the module docstring for the conventions."""
    def decorate(kernel):
        opdef = OpDef(name, kernel, inputs, params or {}, shape, vjp, random, deterministic, method, aliases, flops,
                      torch_function, torch_module, kind)
        for key in (name, *aliases):
            if key in REGISTRY:
                raise ValueError(f"op {key!r} is registered twice")
            REGISTRY[key] = opdef
        if kind is not None:
            if kind in _OF_KIND:
                raise ValueError(f"ops {_OF_KIND[kind]!r} and {name!r} are both of kind {kind!r}")
            _OF_KIND[kind] = name
            for names, flag in ((INPUTS, opdef.is_input), (PROJECTIONS, opdef.is_projection),
                                (LOOPS, opdef.is_loop), (FREE, opdef.free)):
                if flag:
                    names.add(name)
        return kernel
    return decorate


def op_of_kind(kind):
    """The name of the op of `kind` (INPUT, PROJECTION, LOOP, HOLE), for the code that makes such nodes."""
    return _OF_KIND[kind]


def get(name):
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


def unique_opdefs():
    """Each OpDef once (aliases share their OpDef)."""
    return list({id(d): d for d in REGISTRY.values()}.values())


def meta_shape(opdef, inputs, params):
    """Shape rule of last resort: run the kernel on meta tensors (no data, no compute)."""
    metas = [torch.empty(i.shape, dtype=i.dtype, device="meta") for i in inputs]
    out = opdef.kernel(*metas, **params)
    if isinstance(out, (tuple, list)):
        return [(tuple(o.shape), o.dtype) for o in out]
    return tuple(out.shape), out.dtype
