"""A trained model leaves the engine as ordinary PyTorch.

`save(model, name)` records one eval-mode forward pass of the model on a placeholder input and turns it into
a program: a call of the equivalent torch module (nn.Linear, nn.BatchNorm1d, ...) for each built-in layer
call, and a torch function for each op the model's own forward code applies between layers. The program
(JSON-able) and the model's current values (Ops) go into a persisted bundle. At fetch, `load(spec, tensors)`
builds the modules from a whitelist, loads the trained values and emits the program as a torch.fx
GraphModule: a torch.nn.Module that torch.jit.script accepts. No code is ever read from the wire.
"""
import operator
from typing import Any, Iterable, Optional, Sequence

import torch
from torch import fx

import ravop as R
from ravop.client.session import LOADERS
from ravop.core import registry
from ravop.record.graph import current_graph

from .layers.base import Call, Layer, Shape, recording_calls
from .layers.core import Embedding

KIND = "ravdl.model"
TRACE_BATCH = 2   # the placeholder's batch size: above 1, so no size-1 dimension is mistaken for the batch

# The torch.nn classes a spec may name (every built-in layer's torch_spec; an Activation's is its op's).
MODULES = {name: getattr(torch.nn, name) for name in (
    "Linear", "Embedding", "Flatten", "Dropout", "BatchNorm1d", "BatchNorm2d", "LayerNorm", "Conv2d", "MaxPool2d",
    *(opdef.torch_module for opdef in registry.unique_opdefs() if opdef.torch_module is not None))}


# The ops a model's own forward code may apply: those with a TorchScript-able torch equivalent in the registry
# (`OpDef.torch_function`), by the name a saved program calls it.
_BY_NAME = {opdef.torch_function[0].__name__: opdef.torch_function[0] for opdef in registry.unique_opdefs()
            if opdef.torch_function is not None}


# ---------------------------------------------------------------------------------------------- saving

def save(model: Any, name: str) -> None:
    """Persist `model` under `name` as a bundle the loader below turns into a torch.nn.Module."""
    spec, tensors = program(model)
    current_graph().save_bundle(name, KIND, spec, tensors)


def program(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(spec, {key: Op}) of `model`'s eval-mode forward pass, recorded now on a placeholder input."""
    shape, dtype = input_spec(model)
    placeholder = R.t(torch.zeros((TRACE_BATCH,) + shape, dtype=dtype))
    with recording_calls() as calls:
        output = model._forward_pass(placeholder, training=False)
    return _Tracer(model, placeholder, calls).trace(output)


def input_spec(model: Any) -> tuple[Shape, Any]:
    """(shape without the batch dimension, dtype) of the model's input."""
    if model.input_spec is not None:
        return model.input_spec
    first = next((layer for _, layer in model.leaf_layers()), None)
    if first is None or first.input_shape is None:
        raise ValueError("the model's input shape is unknown: give the first layer input_shape=(...) or run a "
                         "forward pass before saving")
    dtype = torch.int64 if isinstance(first, Embedding) else torch.get_default_dtype()
    return first.input_shape, dtype


class _Tracer:
    """Walks the recorded forward pass back from its output, emitting spec nodes in topological order."""

    def __init__(self, model: Any, placeholder: R.Op, calls: list[Call]) -> None:
        self.nodes: list[dict[str, Any]] = [{"op": "placeholder"}]
        self.refs: dict[int, dict[str, int]] = {placeholder.id: {"node": 0}}
        # output Op id -> (layer, input Op, index of the output or None)
        self.calls: dict[int, tuple[Layer, R.Op, Optional[int]]] = {}
        self.tensors: dict[str, R.Op] = {}         # bundle key -> Op
        self.modules: list[dict[str, Any]] = []
        self.layer_of: dict[int, Optional[str]] = {}        # id(layer) -> its module's name
        self.attrs: dict[int, str] = {}           # Op id of a parameter or buffer -> its state_dict key
        for name, layer in model.leaf_layers():
            spec = layer.torch_spec() if layer.built else None
            if spec is None:
                continue   # not run yet, or a math layer, whose op the program applies itself
            module_type, args = spec
            self.modules.append({"name": name, "type": module_type, "args": args,
                                 "extra": layer.torch_extra_state()})
            self.layer_of[id(layer)] = name
            for key, op in layer.state().items():
                self.tensors[f"{name}.{key}"] = op
                self.attrs[op.id] = f"{name}.{key}"
        for layer, X, out in calls:
            outputs = out if isinstance(out, tuple) else (out,)
            for i, op in enumerate(outputs):
                self.calls[op.id] = (layer, X, i if isinstance(out, tuple) else None)
        # (id(layer), input Op id) -> node index of that call
        self.module_nodes: dict[tuple[int, int], dict[str, int]] = {}

    def trace(self, output: Any) -> tuple[dict[str, Any], dict[str, R.Op]]:
        outputs = output if isinstance(output, tuple) else (output,)
        for op in sorted(self._needed(outputs), key=lambda op: op.id):   # ids are a topological order
            self.refs[op.id] = self._emit(op)
        refs = [self.refs[op.id] for op in outputs]
        spec = {"modules": self.modules, "nodes": self.nodes, "output": refs if isinstance(output, tuple) else refs[0],
                "constants": sorted(k for k in self.tensors if k.startswith("const_"))}
        return spec, self.tensors

    def _needed(self, outputs: Sequence[R.Op]) -> Iterable[R.Op]:
        """The ops between the placeholder and `outputs` that become nodes: a layer call's output stands for
        the whole call (its input is needed, not its ops); parameters and constants are leaves."""
        needed: dict[int, R.Op] = {}
        stack = list(outputs)
        while stack:
            op = stack.pop()
            if op.id in needed or op.id in self.refs:
                continue
            needed[op.id] = op
            if op.id in self.calls:
                stack.append(self.calls[op.id][1])
            elif op.id not in self.attrs:
                stack.extend(op.inputs)
        return needed.values()

    def _add(self, node: dict[str, Any]) -> dict[str, int]:
        self.nodes.append(node)
        return {"node": len(self.nodes) - 1}

    def _emit(self, op: R.Op) -> dict[str, int]:
        if op.id in self.calls:
            layer, X, index = self.calls[op.id]
            if id(layer) not in self.layer_of:
                raise ValueError(f"layer {layer.label} is used by the forward pass but is not part of the model "
                                 "(hold it as an attribute before initialize_params, or add it)")
            called = (id(layer), X.id)
            if called not in self.module_nodes:
                self.module_nodes[called] = self._add({"op": "call_module", "target": self.layer_of[id(layer)],
                                                       "args": [self.refs[X.id]]})
            call = self.module_nodes[called]
            return call if index is None else self._add({"op": "getitem", "args": [call, index]})
        if op.id in self.attrs:
            return self._add({"op": "get_attr", "target": self.attrs[op.id]})
        opdef = registry.get(op.op)
        if opdef.is_input:
            key = f"const_{op.id}"
            self.tensors[key] = op
            return self._add({"op": "get_attr", "target": key})
        if opdef.is_projection:
            return self._add({"op": "getitem", "args": [self.refs[op.inputs[0].id], op.params[registry.PICKS]]})
        if opdef.torch_function is None:
            savable = sorted(d.name for d in registry.unique_opdefs() if d.torch_function is not None)
            raise ValueError(f"save_model: op {op.op!r} (recorded at {op.source}) in the model's forward code has "
                             f"no torch equivalent here; ops that can be saved: {', '.join(savable)}")
        function, kwargs = opdef.torch_function
        inputs = [self.refs[i.id] for i in op.inputs]
        args = [inputs] if opdef.variadic else inputs
        return self._add({"op": "call_function", "target": function.__name__, "args": args, "kwargs": kwargs(op)})


# ---------------------------------------------------------------------------------------------- loading

def load(spec: dict[str, Any], tensors: dict[str, Any]) -> Any:
    """The torch.nn.Module (a torch.fx.GraphModule, in eval mode) a bundle of kind "ravdl.model" describes."""
    root = torch.nn.Module()
    for entry in spec["modules"]:
        module_type = MODULES.get(entry["type"])
        if module_type is None:
            raise ValueError(f"saved model names an unknown module type {entry['type']!r}")
        module = module_type(**entry["args"])
        prefix = entry["name"] + "."
        state = {key[len(prefix):]: value for key, value in tensors.items() if key.startswith(prefix)}
        state.update({key: torch.tensor(value) for key, value in entry["extra"].items()})
        module.load_state_dict(state)
        _attach(root, entry["name"], module)
    for key in spec["constants"]:
        root.register_buffer(key, tensors[key])
    graph = fx.Graph()
    values: list[Any] = []
    for node in spec["nodes"]:
        values.append(_node(graph, node, values))
    graph.output(_value(spec["output"], values))
    module = fx.GraphModule(root, graph, class_name="RavdlModel")
    return module.eval()


LOADERS[KIND] = load


def _attach(root: Any, path: str, module: Any) -> None:
    """Put `module` at dotted `path` under `root`, creating plain containers for the intermediate names."""
    *parents, leaf = path.split(".")
    owner = root
    for part in parents:
        if not hasattr(owner, part):
            owner.add_module(part, torch.nn.Module())
        owner = getattr(owner, part)
    owner.add_module(leaf, module)


def _value(arg: Any, values: list[Any]) -> Any:
    if isinstance(arg, dict):
        return values[arg["node"]]
    if isinstance(arg, list):
        return [_value(a, values) for a in arg]
    return arg


def _node(graph: Any, node: dict[str, Any], values: list[Any]) -> Any:
    op = node["op"]
    if op == "placeholder":
        return graph.placeholder("input")
    if op == "get_attr":
        return graph.get_attr(node["target"])
    args = tuple(_value(a, values) for a in node.get("args", ()))
    if op == "call_module":
        return graph.call_module(node["target"], args)
    if op == "getitem":
        return graph.call_function(operator.getitem, args)
    if op == "call_function" and node["target"] in _BY_NAME:
        return graph.call_function(_BY_NAME[node["target"]], args, node.get("kwargs", {}))
    raise ValueError(f"saved model has an unknown node {node!r}")
