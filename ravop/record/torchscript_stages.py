"""A PyTorch model (`R.model(...)`) cut into pipeline stages of its top-level children, as Ravnest's
`clusterize` cuts a model; `Pipeline` (ravop.parallel) trains the stages on different workers.

A model can be cut only where its forward is a chain of its children: `forward(x)` calls child 1 on x, child 2
on that, and so on, and returns the last result, with nothing else in between (a functional `relu`, a residual
`x + f(x)`, a `view` would be lost). `chain_of` checks that twice: on the TorchScript graph of the model's
forward (only the children's `forward` calls, each on the previous result), and by running the model and the
chain of its children on a real micro-batch on the requester (same seed, train mode) and comparing the outputs.

The same pass measures, per child, what a stage holding it needs in memory for one micro-batch: its parameters
(with their gradients and the optimizer's two moments) and buffers, plus the activations autograd saves for the
backward (counted by `torch.autograd.graph.saved_tensors_hooks`, each storage once) and its output, which is also
what crosses to the next stage (and its gradient back).

A stage is a model of its own (`stage_model`): an `nn.Sequential` of its children under their own names (after the
first stage, behind a clone of its input, which an in-place first child must not write into), scripted, so its
parameter and buffer slots are the full model's (`0.weight` stays `0.weight`) and every stage's values are the full
model's graph values, picked by slot name. A forward that is not such a chain is cut on its torch.fx graph instead
(ravop/record/graph_stages.py), when R.model was given the nn.Module.
"""
from collections import OrderedDict
from dataclasses import dataclass

import torch

from ..ops import torchscript, torchscript_safety
from .torchscript_import import _from_module, _internal_jit

_TOLERANCE = dict(rtol=1e-5, atol=1e-6)


@dataclass
class Unit:
    """One top-level child in forward order: its name, the full model's parameter and buffer indices it holds,
    and what was measured on one micro-batch (bytes)."""
    name: str
    params: list
    buffers: list
    param_bytes: int
    activation_bytes: int
    output_bytes: int
    output_shape: tuple

    @property
    def memory(self):
        """Bytes a stage holding this child needs: parameters, their gradients and two optimizer moments,
        buffers, and the activations of one micro-batch."""
        return self.param_bytes + self.activation_bytes


class NotAChain(ValueError):
    """The model's forward is not a chain of its children, so it cannot be cut into pipeline stages."""


def _described(model, module):
    return f"the model {module.original_name} ({model.model_hash[:12]})"


def _loaded_with_values(model):
    """The model's ScriptModule with its initial values in its slots (a tied value in all of its slots)."""
    with _internal_jit():
        module = torchscript_safety.load(model.blob.numpy().tobytes())
    for groups, values in ((model.param_slots, model.params), (model.buffer_slots, model.buffers)):
        for slots, value in zip(groups, values):
            value = value.detach().clone()
            for slot in slots:
                setattr(*torchscript.slot_owner(module, slot), value)
    return module


def _called_children(module, model):
    """The names of the children the forward calls, in order, after checking that the forward's graph is a
    chain of their `forward` calls; NotAChain naming what breaks it."""
    graph = module.forward.graph
    inputs = list(graph.inputs())
    if len(inputs) != 2:
        raise NotAChain(f"{_described(model, module)} takes {len(inputs) - 1} inputs; Pipeline cuts a forward of one "
                        "tensor")
    self_value, value = inputs
    children, names = {}, []
    for node in graph.nodes():
        kind = node.kind()
        if kind == "prim::GetAttr" and node.input().debugName() == self_value.debugName():
            children[node.output().debugName()] = node.s("name")
            continue
        called = [i.debugName() for i in node.inputs()]
        if kind == "prim::CallMethod" and node.s("name") == "forward" and len(called) == 2 \
                and called[0] in children and called[1] == value.debugName():
            names.append(children[called[0]])
            value = node.output()
            continue
        if kind == "prim::Constant":
            continue
        line = node.sourceRange().split("\n")[0].strip() if node.sourceRange() else ""
        raise NotAChain(f"{_described(model, module)} is not a chain of its children: its forward runs {kind} "
                        f"({line or 'no source line'}) besides calling them in turn; Pipeline cuts a forward "
                        "that only calls its children one after the other (make that step a child module, "
                        "e.g. nn.Flatten, or pass an nn.Sequential)")
    returned = list(graph.return_node().inputs())
    if len(returned) != 1 or returned[0].debugName() != value.debugName():
        raise NotAChain(f"{_described(model, module)} is not a chain of its children: its forward does not return the "
                        "last child's result")
    if len(set(names)) != len(names):
        raise NotAChain(f"{_described(model, module)} calls a child twice ({names}); Pipeline cannot put one child's "
                        "weights in two stages")
    if not names:
        raise NotAChain(f"{_described(model, module)} calls no child module: there is nothing to cut")
    return names


def stored_bytes(tensors):
    """Bytes of the storages of `tensors`, each storage once."""
    seen, total = set(), 0
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.device) if t.numel() else id(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes() if t.numel() else 0
    return total


def chain_of(model, sample, seed=0):
    """The `Unit`s of `model` (an `R.model` Model) in forward order, measured on `sample` (one micro-batch, a
    tensor); NotAChain when its forward is not a chain of its children."""
    module = _loaded_with_values(model)
    names = _called_children(module, model)
    children = dict(module.named_children())
    slot_index = {slot: k for k, slots in enumerate(model.param_slots) for slot in slots}
    buffer_index = {slot: k for k, slots in enumerate(model.buffer_slots) for slot in slots}
    owner = {}   # parameter or buffer index -> the child holding it
    units = []
    x = sample.detach()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module.train(True)
        for name in names:
            child = children[name]
            held_params = sorted({slot_index[f"{name}.{slot}"] for slot, _ in child.named_parameters()})
            held_buffers = sorted({buffer_index[f"{name}.{slot}"] for slot, _ in child.named_buffers()})
            for k in held_params:
                if owner.setdefault(("param", k), name) != name:
                    raise NotAChain(f"{_described(model, module)} ties parameter {model.param_names[k]} across "
                                    f"children {owner['param', k]} and {name}; Pipeline cannot cut a tied parameter")
            saved = []
            params = [p.requires_grad_() if p.is_floating_point() else p for p in child.parameters()]
            weights = {p.data_ptr() for p in params}   # saved for the backward, but counted as parameters
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
                # a clone of the leaf, as the stage's own clone (`_ClonedInput`): an in-place child may write it
                out = child(x.requires_grad_().clone() if x.is_floating_point() and units else x)
            if not isinstance(out, torch.Tensor):
                raise NotAChain(f"{_described(model, module)}: child {name} returns {type(out).__name__}; Pipeline "
                                "hands one tensor from stage to stage")
            units.append(Unit(name, held_params, held_buffers,
                              4 * stored_bytes(params) + stored_bytes(list(child.buffers())),
                              stored_bytes([t for t in saved if t.data_ptr() not in weights]) + out.numel() *
                              out.element_size(), out.numel() * out.element_size(), tuple(out.shape[1:])))
            x = out.detach()
        torch.manual_seed(seed)
        with torch.no_grad():
            whole = module(sample)
    unowned = [model.param_names[k] for k in range(len(model.params)) if ("param", k) not in owner]
    if unowned:
        raise NotAChain(f"{_described(model, module)}: parameters {unowned} are in no child its forward calls")
    if not isinstance(whole, torch.Tensor) or whole.shape != x.shape or not torch.allclose(whole, x, **_TOLERANCE):
        raise NotAChain(f"{_described(model, module)} is not a chain of its children: its output differs from "
                        f"calling {', '.join(names)} in turn on the same micro-batch")
    return units


class _ClonedInput(torch.nn.Module):
    """A later stage's first step: its VJP differentiates the stage's input as an autograd leaf, which an in-place
    first child (torchvision's `ReLU(inplace=True)`) must not write into; a copy changes no value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


def stage_model(model, units, cloned):
    """(the `R.model` Model of `units`, contiguous children of `model`, as an nn.Sequential under their own names,
    after a `_ClonedInput` when `cloned` (a stage after the first); the full model's parameter indices in the
    stage's slot order; its buffer indices likewise)."""
    module = _loaded_with_values(model)
    children = dict(module.named_children())
    steps = [("cloned_input", _ClonedInput())] if cloned else []
    stage = _from_module(torch.nn.Sequential(OrderedDict(steps + [(unit.name, children[unit.name]) for unit in units])))
    param_index = {slot: k for k, slots in enumerate(model.param_slots) for slot in slots}
    buffer_index = {slot: k for k, slots in enumerate(model.buffer_slots) for slot in slots}
    return (stage, [param_index[slots[0]] for slots in stage.param_slots],
            [buffer_index[slots[0]] for slots in stage.buffer_slots])
