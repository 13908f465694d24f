"""A TorchScript model as two ops: `torchscript_forward` runs the model with parameter values given as
inputs, and `torchscript_vjp`, its VJP, differentiates the same module with torch.autograd.

Inputs of both (one variadic list): the model's code as a uint8 tensor (`R.model` strips the weights out
of the archive, so the blob is code only and its sha256 `model_hash` names the architecture), then one
tensor per parameter, one per buffer, the positional inputs of `forward`, then its keyword inputs
(`kwarg_names`). `torchscript_vjp` appends one output gradient per model output that has one.

A worker loads a blob once per process and device and keeps the module, keyed by `model_hash` (checked
against the blob when it is loaded). A call binds the given tensors into the module's parameter and buffer
slots (`setattr` on the ScriptModule: no copy, and autograd sees the given tensors), runs it, and empties
the slots again, all under one lock: a cached module is shared, and so is the global RNG that TorchScript's
dropout draws from, which a call reseeds with its `seed` param so that a retry, and the VJP's recomputation,
draw the same mask.

Graph values are never modified in place: in training mode the buffers are cloned before the call, and the
updated clones (BatchNorm's running stats) are extra outputs after the model's own. The VJP op recomputes the
forward under autograd rather than keeping activations between ops (nothing lives in a worker's memory between
subgraphs), as activation checkpointing does. Inside a loop's step (the step compiler, on a CPU) the forward
runs once: under autograd, with the inputs its VJP differentiates as leaves, keeping its graph for the VJP of
the same run (`torchscript_vjp`'s `Reuses`), which is the graph the VJP would build again (the same seed, so the
same dropout draws, the same kernels, the same buffers' updates), so the same bits.
"""
import hashlib
import threading
from collections import OrderedDict, namedtuple
from contextlib import contextmanager

import torch

from ..core import op_functions as R
from ..core.dtypes import is_floating
from ..core.registry import REQUIRED, Reuses, register
from . import torchscript_safety

PROBE_ON_CPU_BYTES = 256 << 20   # inputs (parameters included) a probe fills with zeros on the CPU; past it: meta
CACHE_SIZE = 8            # loaded modules kept per process: each holds its code, not its weights
_lock = threading.RLock()
_modules = OrderedDict()  # (model_hash, device) -> _Loaded
_shapes = {}              # probe key -> Probe: see `_probe`
_flops = {}               # the same key without dtypes -> FLOPs, for the cost model (which sees shapes only)
_EMPTY = torch.empty(0)
Probe = namedtuple("Probe", "specs single")  # output (shape, dtype)s, whether it is one tensor


class _Loaded:
    """A loaded module and, per slot name, the (submodule, attribute) that holds it."""
    __slots__ = ("module", "owners", "training")

    def __init__(self, module):
        self.module = module
        self.owners = {}
        self.training = None

    def owner(self, slot):
        hit = self.owners.get(slot)
        if hit is None:
            hit = self.owners[slot] = slot_owner(self.module, slot)
        return hit


def slot_owner(module, slot):
    """(submodule, attribute name) of a dotted parameter or buffer name such as "conv1.weight"."""
    *path, name = slot.split(".")
    for part in path:
        module = getattr(module, part)
    return module, name


def remember(model_hash, module):
    """Cache a module loaded elsewhere (R.model on the requester) so the shape rule need not reload it."""
    with _lock:
        _modules[(model_hash, "cpu")] = _Loaded(module)
        _evict()


def _evict():
    while len(_modules) > CACHE_SIZE:
        _modules.popitem(last=False)


def _loaded(model_hash, blob, device):
    key = (model_hash, str(device))
    entry = _modules.get(key)
    if entry is not None:
        _modules.move_to_end(key)
        return entry
    data = blob.cpu().numpy().tobytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != model_hash:
        raise ValueError(f"model blob has sha256 {digest}, but the op names model_hash {model_hash}")
    entry = _modules[key] = _Loaded(torchscript_safety.load(data, map_location=device))
    _evict()
    return entry


@contextmanager
def _bound(entry, slots, values, training, seed, device):
    """The module with `values` in its slots (a tied group of slots gets one value), in train/eval mode,
    with `device`'s global RNG seeded by `seed` when training; afterwards the slots hold nothing again."""
    for group, value in zip(slots, values):
        for slot in group:
            owner, name = entry.owner(slot)
            setattr(owner, name, value)
    if entry.training is not training:
        entry.module.train(training)
        entry.training = training
    try:
        if training:
            with _seeded(device, seed):
                yield entry.module
        else:
            yield entry.module
    finally:
        for group in slots:  # drop the references: the values (and their autograd graphs) are the caller's
            for slot in group:
                owner, name = entry.owner(slot)
                setattr(owner, name, _EMPTY)


@contextmanager
def _seeded(device, seed):
    """The default generator of `device` (the one TorchScript's dropout draws from) seeded with `seed`,
    and restored afterwards."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        with torch.random.fork_rng(devices=[index]):
            torch.cuda.default_generators[index].manual_seed(seed)
            yield
    else:
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            yield


def _versions(tensors):
    """Version counters, to catch a forward that writes into its inputs (inference tensors have none)."""
    return [None if x.is_inference() else x._version for x in tensors]


def _outputs(out):
    """The model's result as a tuple of tensors; a clear error for anything else."""
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
        return tuple(out)
    raise TypeError(f"the model's forward returned {type(out).__name__}; torchscript_forward takes a model "
                    "that returns a tensor or a non-empty tuple/list of tensors")


def _split(xs, param_slots, buffer_slots, n_args, kwarg_names):
    """(blob, params, buffers, args, kwargs) from the op's flat inputs."""
    expected = 1 + len(param_slots) + len(buffer_slots) + n_args + len(kwarg_names)
    if len(xs) != expected:
        raise ValueError(f"expected {expected} inputs (blob, {len(param_slots)} params, {len(buffer_slots)} "
                         f"buffers, {n_args} args, {len(kwarg_names)} kwargs), got {len(xs)}")
    a = 1 + len(param_slots)
    b = a + len(buffer_slots)
    c = b + n_args
    return xs[0], list(xs[1:a]), list(xs[a:b]), list(xs[b:c]), dict(zip(kwarg_names, xs[c:]))


def _run(xs, model_hash, param_slots, buffer_slots, n_args, kwarg_names, training, seed):
    """Call the model on the op's inputs -> (its result, buffers after the call). Hold `_lock`."""
    blob, params, buffers, args, kwargs = _split(xs, param_slots, buffer_slots, n_args, kwarg_names)
    entry = _loaded(model_hash, blob, blob.device)
    if training:
        buffers = [b.detach().clone() for b in buffers]
    with _bound(entry, param_slots + buffer_slots, params + buffers, training, seed, blob.device) as module:
        inputs = params + args + list(kwargs.values())
        versions = _versions(inputs)
        # Unoptimised: TorchScript's profiling executor rewrites a graph after its first calls (BatchNorm's
        # backward then rounds otherwise), so the bits would hang on how often this process ran the module.
        with torch.jit.optimized_execution(False):
            result = module(*args, **kwargs)
    if versions != _versions(inputs):
        raise RuntimeError("the model's forward modified a parameter or an input in place; graph values are "
                           "immutable: write x = x + y instead of x += y in the model")
    return result, buffers


# ---------------------------------------------------------------------------------------------- forward

FORWARD_PARAMS = {"model_hash": REQUIRED, "param_slots": (), "buffer_slots": (), "n_args": 1, "kwarg_names": (),
                  "training": False, "seed": 0}


def _check_blob(blob):
    if blob.dtype != torch.uint8 or len(blob.shape) != 1:
        raise TypeError(f"the first input must be the model blob (1-d uint8, from R.model), not {blob.shape} "
                        f"{blob.dtype}")


def _probe(xs, model_hash, param_slots, buffer_slots, n_args, kwarg_names, training):
    """The `Probe` of the model on inputs of these shapes and dtypes, found by running it once on
    the requester, and cached per model and input shapes: the output shape of TorchScript code cannot be
    read off it. Zero-filled CPU tensors first while the inputs, parameters included, are at most
    `PROBE_ON_CPU_BYTES`: meta kernels of batch norm, layer norm and others are torch's Python decompositions,
    whose first call imports torch._dynamo (2-3 s and 71 MiB in the requester, issue 46), where a small model's
    forward on zeros costs a fraction of that. Larger models go on meta tensors (no data, no compute) first, and
    on zeros if meta tensors cannot run them (data-dependent control flow, an op without a meta kernel)."""
    key = (model_hash, training, n_args, tuple(kwarg_names), tuple((x.shape, x.dtype) for x in xs[1:]))
    hit = _shapes.get(key)
    if hit is not None:
        return hit
    blob = xs[0]
    if any(d < 0 for x in xs[1:] for d in x.shape):
        raise ValueError("a TorchScript model's inputs need known shapes (no data-dependent -1 dimensions)")
    value = blob.graph.constants.get(blob.id)
    if value is None:
        raise ValueError("the model blob must be the constant R.model made")
    # Here, not at import: torch's FLOP formulas load torch.fx (a fifth of a second), and only a requester probes.
    from .flop_count import FlopCount
    held = sum(x.dtype.itemsize * torch.Size(x.shape).numel() for x in xs[1:])
    devices = ("cpu",) if held <= PROBE_ON_CPU_BYTES else ("meta", "cpu")
    for device in devices:
        tensors = [torch.zeros(x.shape, dtype=x.dtype, device=device) for x in xs[1:]]
        try:
            with _lock, torch.no_grad(), FlopCount() as counter:
                result, _ = _run([value, *tensors], model_hash, param_slots, buffer_slots, n_args, kwarg_names,
                                 training, 0)
        except (RuntimeError, NotImplementedError):
            if device == "meta":
                continue
            raise
        break
    outputs = _outputs(result)
    specs = [(tuple(o.shape), o.dtype) for o in outputs]
    hit = _shapes[key] = Probe(specs, isinstance(result, torch.Tensor))
    _flops[_flops_key(model_hash, training, n_args, kwarg_names, [x.shape for x in xs[1:]])] = float(
        max(counter.total, sum(o.numel() for o in outputs)))
    return hit


def _flops_key(model_hash, training, n_args, kwarg_names, shapes):
    return model_hash, training, n_args, tuple(kwarg_names), tuple(tuple(s) for s in shapes)


def probe(xs, params):
    """The `Probe` of a forward to record on Ops `xs` with `params` (for `ravop.record.torchscript_import`)."""
    return _probe(xs, params["model_hash"], params["param_slots"], params["buffer_slots"], params["n_args"],
                  params["kwarg_names"], params["training"])


def _forward_shape(*xs, model_hash, param_slots, buffer_slots, n_args, kwarg_names, training, seed):
    _check_blob(xs[0])
    _, _, buffers, _, _ = _split(xs, param_slots, buffer_slots, n_args, kwarg_names)
    specs = _probe(xs, model_hash, param_slots, buffer_slots, n_args, kwarg_names, training).specs
    return specs + ([(b.shape, b.dtype) for b in buffers] if training else [])


def _forward_vjp(node, g, wants):
    p = node.params
    n_model = len(node.shape) - (len(p["buffer_slots"]) if p["training"] else 0)
    grads = g[:n_model]  # the running stats after the call (the extra outputs) carry no gradient either
    grad_mask = tuple(gi is not None for gi in grads)
    values = node.inputs[1:]
    n_params, n_buffers = len(p["param_slots"]), len(p["buffer_slots"])
    # Buffers carry no gradient, as in torch (BatchNorm refuses running stats that require grad).
    mask = tuple(not n_params <= i < n_params + n_buffers and is_floating(x.dtype)
                 and wants(x) for i, x in enumerate(values))
    if not any(mask) or not any(grad_mask):
        return (None,) * len(node.inputs)
    out = iter(R.torchscript_vjp([*node.inputs, *(gi for gi in grads if gi is not None)],
                                 **p, mask=mask, grad_mask=grad_mask))
    return (None,) + tuple(next(out) if wanted else None for wanted in mask)


def _forward_flops(shape, input_shapes, params, n_grads=0):
    """FLOPs counted when the forward on these shapes was probed (recording it probes it, in the process that
    compiles it); None if it was not."""
    p = params
    return _flops.get(_flops_key(p["model_hash"], p["training"], p["n_args"], p["kwarg_names"],
                                 input_shapes[1:len(input_shapes) - n_grads]))


@register("torchscript_forward", inputs=("*xs",), params=FORWARD_PARAMS, shape=_forward_shape,
          vjp=_forward_vjp, method=False, flops=_forward_flops, seed_param="seed")
def torchscript_forward(*xs, model_hash, param_slots, buffer_slots, n_args, kwarg_names, training, seed):
    """xs = (blob, *params, *buffers, *args, *kwargs): the model's outputs, then, when training, its buffers
    after the call."""
    with _lock:
        result, buffers = _run(xs, model_hash, param_slots, buffer_slots, n_args, kwarg_names, training, seed)
    outputs = _outputs(result)
    return outputs + tuple(buffers) if training else outputs


# ---------------------------------------------------------------------------------------------- vjp

def _vjp_split(xs, mask, grad_mask):
    n_grads = sum(grad_mask)
    values, grads = xs[:len(xs) - n_grads], xs[len(xs) - n_grads:]
    if len(values) != 1 + len(mask):
        raise ValueError(f"mask has {len(mask)} entries for {len(values) - 1} model inputs")
    return values, grads


def _vjp_shape(*xs, mask, grad_mask, **params):
    _check_blob(xs[0])
    values, grads = _vjp_split(xs, mask, grad_mask)
    specs = _probe(values, params["model_hash"], params["param_slots"], params["buffer_slots"],
                   params["n_args"], params["kwarg_names"], params["training"]).specs
    if len(grad_mask) != len(specs):
        raise ValueError(f"grad_mask has {len(grad_mask)} entries, the model has {len(specs)} outputs")
    for g, (shape, _) in zip(grads, [s for s, wanted in zip(specs, grad_mask) if wanted]):
        if tuple(g.shape) != tuple(shape):
            raise ValueError(f"an output gradient has shape {g.shape}, its output has shape {shape}")
    wanted = [x for x, m in zip(values[1:], mask) if m]
    if any(not is_floating(x.dtype) for x in wanted):
        raise TypeError("mask asks for the gradient of an integer input")
    return [(x.shape, x.dtype) for x in wanted]


def _vjp_flops(shape, input_shapes, params):
    """A forward recomputed under autograd and its backward: about three forwards."""
    forward = _forward_flops(shape, input_shapes, params, n_grads=sum(params["grad_mask"]))
    return None if forward is None else 3 * forward


def _leaves(values, mask):
    """The forward's inputs (blob first) with those `mask` names made autograd leaves (aliases: no copy)."""
    return [values[0]] + [x.detach().requires_grad_() if m else x for x, m in zip(values[1:], mask)]


def _gradients(outputs, leaves, grads, mask, grad_mask):
    """The gradients w.r.t. the leaves `mask` names of the `outputs` (under autograd) `grad_mask` names, given
    `grads`; zeros for a leaf they do not depend on. Frees the graph (no retain_graph), as backward() does."""
    chosen = [o for o, m in zip(outputs, grad_mask) if m]
    wrt = [x for x, m in zip(leaves[1:], mask) if m]
    differentiable = [(o, g) for o, g in zip(chosen, grads) if o.requires_grad]
    found = torch.autograd.grad([o for o, _ in differentiable], wrt, [g.to(o.dtype) for o, g in differentiable],
                                allow_unused=True) if differentiable else [None] * len(wrt)
    return tuple(torch.zeros_like(x) if d is None else d for x, d in zip(wrt, found))


# What a forward run under autograd left for its VJP (`_forward_keeping`): its inputs as given (compared by
# identity), the seed it ran with (this run's), the model's outputs carrying their autograd graph, its leaves.
_Kept = namedtuple("_Kept", "inputs seed outputs leaves")


def _vjp_box(params):
    """A forward's box for the VJP that follows it: [the VJP's mask (the leaves to make), what it kept or None]."""
    return [tuple(params["mask"]), None]


def _forward_keeping(box, *xs, model_hash, param_slots, buffer_slots, n_args, kwarg_names, training, seed):
    """torchscript_forward run once under autograd, with the inputs the VJP differentiates as leaves, as the VJP
    recomputes it (the same seed, so the same dropout draws; the same kernels): the same outputs, detached, and
    buffers; the graph is kept in box[1] for the VJP later in the same run of a step (the step compiler)."""
    box[1] = None   # a graph this run's VJP did not take (it fell back): let it go before making another
    leaves = _leaves(xs, box[0])
    with _lock, torch.enable_grad():
        result, buffers = _run(leaves, model_hash, param_slots, buffer_slots, n_args, kwarg_names, training, seed)
    outputs = _outputs(result)
    box[1] = _Kept(xs, seed, outputs, leaves)
    detached = tuple(o.detach() for o in outputs)
    return detached + tuple(buffers) if training else detached


def _vjp_kept(box, *xs, model_hash, param_slots, buffer_slots, n_args, kwarg_names, training, seed, mask, grad_mask):
    """torchscript_vjp through the graph its forward kept in this run (the same graph it would build again, so
    the same bits), which it frees; recomputed as the op where nothing was kept for these inputs, this seed and
    this mask (the forward did not run in this run, or another VJP of it took the graph: each is taken once)."""
    kept, box[1] = box[1], None
    values, grads = _vjp_split(xs, mask, grad_mask)
    if kept is None or kept.seed != seed or tuple(mask) != box[0] or len(kept.inputs) != len(values) or \
            any(a is not b for a, b in zip(kept.inputs, values)):
        return torchscript_vjp(*xs, model_hash=model_hash, param_slots=param_slots, buffer_slots=buffer_slots,
                               n_args=n_args, kwarg_names=kwarg_names, training=training, seed=seed, mask=mask,
                               grad_mask=grad_mask)
    with torch.enable_grad():
        return _gradients(kept.outputs, kept.leaves, grads, mask, grad_mask)


# In a loop's step the VJP takes its backward from the forward's autograd graph, kept in the same run: one forward
# per step (outside a step, or across workers, nothing lives between ops and the VJP recomputes the forward).
@register("torchscript_vjp", inputs=("*xs",), params={**FORWARD_PARAMS, "mask": REQUIRED, "grad_mask": REQUIRED},
          shape=_vjp_shape, method=False, flops=_vjp_flops, seed_param="seed",
          reuses=Reuses("torchscript_forward", _forward_keeping, _vjp_kept, "torchscript_graphs_kept",
                        same=("model_hash", "param_slots", "buffer_slots", "n_args", "kwarg_names", "training",
                              "seed"), box=_vjp_box))
def torchscript_vjp(*xs, model_hash, param_slots, buffer_slots, n_args, kwarg_names, training, seed, mask, grad_mask):
    """xs = (forward inputs..., one gradient per output with grad_mask True): the gradients of the forward
    w.r.t. its inputs with mask True, by torch.autograd through the same module (the forward is recomputed
    with the same seed)."""
    values, grads = _vjp_split(xs, mask, grad_mask)
    leaves = _leaves(values, mask)
    with _lock, torch.enable_grad():
        result, _ = _run(leaves, model_hash, param_slots, buffer_slots, n_args, kwarg_names, training, seed)
        return _gradients(_outputs(result), leaves, grads, mask, grad_mask)
