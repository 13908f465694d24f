"""The recorded program: an append-only table of `Op` nodes, and the function that records one.

An `Op` is both the user's lazy handle and the node of the graph (one object, so recording stays cheap).
It is hashable by identity; comparison dunders return new Ops (see `ravop.record.api`).
"""
import uuid
import warnings
from contextlib import contextmanager

import numpy as np
import torch

from ..core import recorder, registry
from ..core.dtypes import DTYPES
from ..core.errors import GraphStateError, ShapeError
from ..core.loss_names import RunNames
from ..core.sizes import numel
from .job_settings import job_settings
from .source import user_source
from .step_outputs import StepOutputs
from .strategy_notes import StrategyNotes


class Shape(tuple):
    """An op's shape: a tuple (`op.shape[0]`, `len(op.shape)`), which may also be called as the original's
    method: `op.shape()` records the shape as an int64 tensor op, as the original's `shape` op gave."""
    __slots__ = ()

    def __call__(self):
        if any(d < 0 for d in self):
            raise ShapeError(f"shape {tuple(self)} has a size known only when the op runs: use R.shape(op)")
        return current_graph().constant(torch.tensor(self, dtype=torch.int64), user_source())


class Op:
    __slots__ = ("graph", "id", "op", "inputs", "params", "shape", "dtype", "source", "__weakref__")

    def __init__(self, graph, id, op, inputs, params, shape, dtype, source):
        self.graph = graph
        self.id = id              # position in graph.nodes
        self.op = op              # registry name
        self.inputs = inputs      # tuple of Op
        self.params = params      # dict of canonical params (tuples, numbers, strings, None)
        # tuple of ints; a tuple of shapes for a multi-output node (a unary op's rule hands on its input's Shape)
        self.shape = shape if type(shape) is Shape else Shape(shape)
        self.dtype = dtype        # torch.dtype; a tuple of dtypes for a multi-output node
        self.source = source      # "file:line" of the user's code that recorded it

    __hash__ = object.__hash__

    @property
    def ndim(self):
        return len(self.shape)

    def numel(self):
        """Number of elements; -1 when a dimension is known only when the op runs."""
        return numel(self.shape)

    def output(self, i):
        """Output `i` of this multi-output op (what recording it returned at position i)."""
        outputs = self.graph.projections.get(self.id)
        if outputs is None:
            raise TypeError(f"{self!r} has a single output")
        return outputs[i]

    def persist_op(self, name, save_model=False):
        """Keep this op's value in Redis under `name`, to fetch with `R.fetch_persisting_op(name)`."""
        self.graph.persist(name, self, save_model=save_model)
        return self

    def __reduce__(self):
        raise TypeError(f"{self!r} is a value of a recorded graph and is not pickled: pickle models (their "
                        "structure), and persist values to fetch them")

    def __bool__(self):
        raise TypeError("an Op has no truth value before it runs; fetch a persisted value to branch on it")

    def __iter__(self):
        raise TypeError("an Op cannot be iterated before it runs; index it (op[i]) or use R.split")

    def _no_value(self, conversion):
        raise TypeError(f"{conversion}() of {self!r}: ops are lazy, so it has no value until its graph runs; "
                        "persist it (op.persist_op('name')), run R.activate(), R.execute(), then "
                        "R.fetch_persisting_op('name') returns the tensor")

    def __float__(self):
        self._no_value("float")

    def __array__(self, dtype=None, copy=None):
        self._no_value("numpy.asarray")

    # numpy's operators hand an Op back to the Op's own (np.ones(3) + op records an add), instead of
    # converting the Op to an array, which it cannot be before it runs.
    __array_ufunc__ = None

    def __int__(self):
        self._no_value("int")

    def __complex__(self):
        self._no_value("complex")

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d Op")
        return self.shape[0]

    @property
    def name(self):
        """The name given with `R.t(..., name=...)`, or None."""
        return self.graph.labels.get(self.id)

    def __repr__(self):
        label = f" {self.name!r}" if self.id in self.graph.labels else ""
        if isinstance(self.dtype, tuple):
            return f"<Op {self.id}{label} {self.op} ({len(self.dtype)} outputs)>"
        return f"<Op {self.id}{label} {self.op} {tuple(self.shape)} {self.dtype}>"


class Graph:
    """A requester's program. `R.Graph(...)` creates one and makes it the current graph."""

    def __init__(self, name="graph", algorithm="", approach="distributed", gpu_required="no", rules=None,
                 seed=0, verify=1, strategy=None):
        self.id = uuid.uuid4().hex[:12]
        self.settings = job_settings(name, algorithm, approach, gpu_required, rules, seed, verify, strategy)
        self.strategy_notes = StrategyNotes()   # its strategies' fits, loops by role, rounds and forms
        self.nodes = []           # append-only op table; node.id is its index
        self.constants = {}       # node id -> torch.Tensor held by the requester until upload
        self.persisted = {}       # persist name -> Op
        self.bundles = {}         # name -> (kind, spec, {key: persist name}): objects rebuilt at fetch
        self.loops = {}           # loop node id -> ravop.record.loop.LoopRecord
        self.step_outputs = StepOutputs()  # persist name -> Op of a loop step persisted at one of its runs
        self.step_ids = set()     # ids of the ops recorded inside loop steps (templates, not values)
        self.recording_step = None  # the ravop.record.loop.Step being recorded, if any
        self.activated = False
        self.implicit = False     # the default graph current_graph() makes for ops recorded without an R.Graph
        self._scalars = {}        # (type, value) -> constant Op, so `x + 1` reuses one constant
        self.labels = {}          # node id -> the name a user gave it (R.t(..., name=...))
        self.projections = {}     # multi-output node id -> its outputs (Ops picking each; see `add_outputs`)
        set_current(self)

    # The job settings as attributes, as the original's Graph had them (read-only: they are the script's).
    name = property(lambda self: self.settings.name)
    algorithm = property(lambda self: self.settings.algorithm)
    approach = property(lambda self: self.settings.approach)
    gpu_required = property(lambda self: self.settings.gpu_required)
    rules = property(lambda self: self.settings.rules)
    seed = property(lambda self: self.settings.seed)
    verify = property(lambda self: self.settings.verify)
    spot = property(lambda self: self.settings.spot)
    strategy = property(lambda self: self.settings.strategy)

    def __repr__(self):
        return f"<Graph {self.name!r} id={self.id} ops={len(self.nodes)}>"

    def check_open(self):
        if self.activated:
            raise GraphStateError(f"graph {self.name!r} is activated: no ops may be added (start a new R.Graph)")

    def add_node(self, op, inputs, params, shape, dtype, source):
        node = Op(self, len(self.nodes), op, inputs, params, shape, dtype, source)
        self.nodes.append(node)
        return node

    def add_outputs(self, node, specs, source):
        """One node per output of multi-output `node` (its (shape, dtype) `specs`), recorded right after it."""
        pick = registry.op_of_kind(registry.PROJECTION)
        outputs = self.projections[node.id] = tuple(self.add_node(pick, (node,), {registry.PICKS: i}, s, d, source)
                                                    for i, (s, d) in enumerate(specs))
        return outputs

    def constant(self, tensor, source=None):
        self.check_open()
        node = self.add_node(registry.op_of_kind(registry.INPUT), (), None, tuple(tensor.shape), tensor.dtype,
                             source or user_source())
        self.constants[node.id] = tensor
        return node

    def label(self, op, name):
        if not isinstance(name, str):
            raise TypeError(f"an op's name must be a string, not {name!r}")
        self.labels[op.id] = name

    def scalar(self, value):
        key = (type(value), value)
        node = self._scalars.get(key)
        if node is None:
            node = self._scalars[key] = self.constant(torch.tensor(value, dtype=_SCALAR_DTYPES[type(value)]))
        return node

    def persist(self, name, op, save_model=False):
        self.check_open()
        if not isinstance(name, str) or not name:
            raise ValueError(f"persist name must be a non-empty string, not {name!r}")
        if op.graph is not self:
            raise GraphStateError(f"cannot persist {op!r}: it belongs to another graph")
        if isinstance(op.dtype, tuple):
            raise ValueError(f"cannot persist multi-output op {op.op!r}; persist one of its outputs")
        if self.recording_step is not None or op.id in self.step_ids:
            raise GraphStateError(f"{op!r} is recorded inside a loop step, where it has one value per run: "
                                  "persist it with step.persist(op, names) (ravop.record.loop)")
        if name in self.bundles or name.partition("::")[0] in self.bundles or name in self.step_outputs:
            raise ValueError(f"persist name {name!r} is already used by a saved model or a training loop's step in "
                             f"graph {self.name!r}")
        earlier = self.persisted.get(name)
        if earlier is not None and earlier is not op:
            # The original allowed this (a script's score() persists predict()'s value again); the later
            # op wins, as a later assignment to a variable does, and the user hears about it.
            warnings.warn(f"persist name {name!r} was already given to op {earlier.id} (recorded at "
                          f"{earlier.source}); it now names op {op.id} (recorded at {op.source})", stacklevel=3)
        self.persisted[name] = op

    def check_persist_name(self, name):
        self.check_open()
        if not isinstance(name, str) or not name:
            raise ValueError(f"persist name must be a non-empty string, not {name!r}")
        if name in self.persisted or name in self.step_outputs or name in self.bundles:
            raise ValueError(f"persist name {name!r} is already used in graph {self.name!r}")

    def check_persist_names(self, names):
        """`check_persist_name` for each of a loop step's `names`; a rule (RunNames) is checked in O(1) against
        the other rules and against the names given one by one, not name by name."""
        if not isinstance(names, RunNames):
            for name in names:
                self.check_persist_name(name)
            return
        self.check_open()
        taken = next((name for name in (*self.persisted, *self.bundles, *self.step_outputs.listed())
                      if name in names), None)
        clash = next((rule for rule in self.step_outputs.rules() if rule.overlaps(names)), taken)
        if clash is not None:
            raise ValueError(f"persist names {names!r} take {clash!r}, already used in graph {self.name!r}")

    def save_bundle(self, name, kind, spec, tensors):
        """Persist an object made of several tensors (a trained model) under one name.

        `kind` picks the loader that `R.fetch_persisting_op(name)` calls (see ravop.client.session.LOADERS);
        `spec` is JSON-able data the loader needs; `tensors` maps keys to Ops, each persisted as
        "name::key"."""
        self.check_persist_name(name)
        names = {}
        for key, op in tensors.items():
            names[key] = f"{name}::{key}"
            self.persist(names[key], op)
        self.bundles[name] = (kind, spec, names)


_SCALAR_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float32, complex: torch.complex64}
_current = None
NO_PARAMS = {}  # shared by every op recorded without params; params are never mutated after recording


def set_current(graph):
    global _current
    _current = graph


@contextmanager
def scratch_graph(name, seed=0):
    """A graph to record into apart from the user's (the session records a strategy's replicas of a folded loop
    in one at activation); the graph that was current before is current again after."""
    previous = _current
    try:
        yield Graph(name=name, seed=seed)
    finally:
        set_current(previous)


def current_graph():
    """The graph ops are recorded into; a default one is created on first use."""
    if _current is not None:
        return _current
    graph = Graph(name="default")
    graph.implicit = True
    return graph


def unactivated_graph():
    """The graph this process records into, when the user started one (R.Graph, or ops recorded) and has not
    activated it yet: the graph a read of "the current graph" means, which has no values in the store. None
    otherwise (a process that records nothing reads the token's last activated graph: README, "First two machines")."""
    graph = _current
    if graph is None or graph.activated or (graph.implicit and not graph.nodes):
        return None
    return graph


# ---------------------------------------------------------------------------------------------- recording

def to_tensor(value):
    """A torch tensor from a list, numpy array, number or tensor; a clear error for anything non-numeric."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous()
    if type(value) in _SCALAR_DTYPES:  # not isinstance: np.float64 is a float, yet keeps its dtype below
        return torch.tensor(value, dtype=_SCALAR_DTYPES[type(value)])
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"cannot make a tensor from {type(value).__name__} {value!r}: give numbers")
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:  # ragged lists, unconvertible objects
        raise ValueError(f"cannot make a tensor from {_short(value)}: {exc}") from None
    if array.dtype.kind not in "biufc":
        raise TypeError(f"cannot make a tensor from {_short(value)}: it holds {array.dtype} values, not numbers")
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        return _from_numpy(array)
    # Lists follow torch's defaults (float32 for floats, int64 for ints), as torch.tensor(list) does.
    return torch.tensor(array.tolist() if array.dtype.kind == "f" else array)


def _from_numpy(array):
    """A tensor on the array's own memory where torch can use it as it is (C-contiguous, native byte order,
    writable, a dtype the wire carries), as for a torch tensor: R.t of a 500 MB array costs no second 500 MB.
    The graph then reads the array when R.activate() uploads it, so a change made to it before that counts.
    Anything else is copied."""
    if array.flags.c_contiguous and array.flags.writeable and array.dtype.isnative and array.dtype.name in DTYPES:
        return torch.from_numpy(array)
    return torch.from_numpy(array.astype(array.dtype.newbyteorder("="), order="C"))   # a copy, native order


def _short(value):
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


def as_op(value, graph):
    if isinstance(value, Op):
        if value.graph is not graph:
            raise GraphStateError(f"{value!r} belongs to graph {value.graph.name!r}, not the current graph "
                                  f"{graph.name!r} (ops cannot cross graphs; R.flush() starts a new one)")
        return value
    if type(value) in _SCALAR_DTYPES:
        graph.check_open()
        return graph.scalar(value)
    return graph.constant(to_tensor(value))


def _as_ops(values, graph):
    """`as_op` of each input; a Python number (`x * 0.5`) takes the short way to its shared constant."""
    scalars = graph._scalars
    ops = []
    for v in values:
        kind = type(v)
        if kind is Op and v.graph is graph:
            ops.append(v)
        elif kind in _SCALAR_DTYPES:
            op = scalars.get((kind, v))
            ops.append(op if op is not None else graph.scalar(v))
        else:
            ops.append(as_op(v, graph))
    return tuple(ops)


# The original API took booleans as strings too (keepdims="True"); they become bools when recorded, so
# what records also runs. Any other value of a boolean param is an error here, not on the worker.
_BOOL_STRINGS = {"True": True, "False": False, "true": True, "false": False}


def as_flag(value, name, op_name):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str) and value in _BOOL_STRINGS:
        return _BOOL_STRINGS[value]
    raise TypeError(f"{op_name}() param {name} must be True or False (or 'True'/'False'), not {value!r}")


def canonical(value):
    """Params are stored hashable and JSON-friendly: tuples for sequences, plain Python numbers."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(canonical(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.dtype):
        from ..core.dtypes import NAMES
        return NAMES[value]
    if isinstance(value, dict):
        return tuple(sorted((str(k), canonical(v)) for k, v in value.items()))
    raise TypeError(f"param value {value!r} of type {type(value).__name__} is not a number, string, "
                    "bool, None or a sequence of them")


def record(opdef, inputs, params):
    """Record one op (the hot path): check inputs, run the shape rule, append the node."""
    graph = _current if _current is not None else current_graph()
    if graph.activated:
        graph.check_open()
    for v in inputs:
        if type(v) is not Op or v.graph is not graph:
            inputs = _as_ops(inputs, graph)
            break
    rule = opdef.shape
    checked = params
    if opdef.counter is not None and graph.recording_step is not None and params.get(opdef.counter) == 0:
        checked = graph.recording_step.counted_params(opdef.counter, params)
    try:
        if rule is not None:
            out = rule(*inputs, **checked) if checked else rule(*inputs)
        else:
            out = registry.meta_shape(opdef, inputs, params)
    except (ValueError, TypeError, IndexError, RuntimeError) as exc:
        shapes = ", ".join(str(tuple(i.shape)) for i in inputs)
        raise ShapeError(f"{opdef.name}: {exc} (input shapes: {shapes}) at {user_source()}") from None
    source = user_source(2)   # from record's caller: this frame is the library's
    if type(out) is list:
        node = graph.add_node(opdef.name, inputs, params, tuple(s for s, _ in out), tuple(d for _, d in out),
                              source)
        return graph.add_outputs(node, out, source)
    nodes = graph.nodes
    node = Op(graph, len(nodes), opdef.name, inputs, params, out[0], out[1], source)
    nodes.append(node)
    return node


recorder.install(record)   # the op modules' VJP rules record through it (ravop.core.recorder)
