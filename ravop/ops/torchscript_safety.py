"""Which TorchScript a provider agrees to run: an allow-list of pure tensor computation, checked on the loaded
code of every method of every submodule, with every call inlined, before anything runs.

A model blob comes from Redis, which anyone holding its URL can write, and is run by every provider. TorchScript
can do more than tensor math: write and read files (`aten::save`, `aten::from_file`), call custom or
distributed ops (`myns::op`, `c10d::`, RRefs, futures), print. So a node is accepted only if
- it is a `prim::` node in `PRIM_KINDS` (control flow, containers, attribute access: the interpreter's own), or
- it is an `aten::` op whose matched schema takes and returns only value types (tensors, numbers, devices,
  generators, lists/tuples/dicts/optionals of them) - no futures, RRefs, streams or class objects - and, if it
  takes a string, is in `STRING_OPS`: ops whose string is a mode, an equation or Python string handling, never
  a path.
Anything else (another namespace, a string-taking op not reviewed, a call left after inlining) is refused.

Loading an archive runs the `__setstate__` methods of the objects it holds, so that name is refused in the
archive's code before `torch.jit.load`, as are duplicate zip entries (which copy of a file torch reads need not
be the one checked).
"""
import io
import zipfile

import torch

PRIM_KINDS = frozenset(f"prim::{k}" for k in (
    "Constant", "If", "Loop", "GetAttr", "SetAttr", "ListConstruct", "ListUnpack", "TupleConstruct",
    "TupleUnpack", "TupleIndex", "TupleSlice", "DictConstruct", "DictIndex", "RaiseException", "Uninitialized",
    "unchecked_cast", "NumToTensor", "device", "dtype", "layout", "is_nested", "requires_grad", "is_cuda", "type",
    "data", "shape", "min", "max", "isinstance", "TypeCheck", "EnumName", "EnumValue", "abs", "grad",
))

# Value types an aten op may take or return (by torch._C type class name; ScalarType, Layout and
# MemoryFormat travel as ints). "Type" is a schema's type variable (t), bound to one of these by the call.
VALUE_TYPES = frozenset((
    "TensorType", "IntType", "FloatType", "BoolType", "ComplexType", "NumberType", "NoneType", "ListType",
    "TupleType", "DictType", "OptionalType", "DeviceObjType", "_GeneratorType", "Type", "AnyType", "StringType",
))

# aten ops that take a string, reviewed: modes, equations, str/list/dict methods. Not save, from_file, _print.
STRING_OPS = frozenset(f"aten::{k}" for k in (
    *(name for name in dir(str) if not name.startswith("_")),   # "abc".upper() and the like
    "Delete", "Float", "Int", "__contains__", "__getitem__", "_set_item", "__interpolate", "__upsample",
    "_assert_async", "_assert_scalar", "_functional_assert_async", "_functional_assert_scalar",
    "_convolution_mode", "_linalg_check_errors", "_linalg_eigh", "_linalg_svd", "_mixed_dtypes_linear",
    "add", "eq", "ne", "lt", "le", "gt", "ge", "format", "percentFormat", "list", "len", "get", "setdefault", "pop",
    "remove", "slice", "warn", "device", "get_autocast_dtype",
    "conv1d", "conv2d", "conv3d", "div", "div_", "divide", "divide_", "einsum", "gelu", "gelu_", "gelu_backward",
    "pad", "pad_sequence", "meshgrid", "quantile", "nanquantile", "searchsorted", "stft", "scatter", "scatter_",
    "scatter_reduce", "scatter_reduce_", "index_reduce", "index_reduce_", "segment_reduce",
    "linalg_cond", "linalg_eigh", "linalg_eigvalsh", "linalg_lstsq", "linalg_matrix_norm", "linalg_norm",
    "linalg_qr", "linalg_svd", "linalg_svdvals",
    *(f"fft_{kind}{dims}" for kind in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft") for dims in ("", "2", "n")),
))


class UnsafeModelError(ValueError):
    """A TorchScript archive holds code a provider does not run."""


def check_archive(data):
    """Refuse, before loading, an archive that is not one, that holds duplicate entries, or whose code
    defines `__setstate__` (run by torch.jit.load itself)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = archive.namelist()
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise UnsafeModelError(f"the model archive holds duplicate entries {duplicates[:3]}: which copy "
                                   "torch would read is not the one checked")
        sources = {n: archive.read(n) for n in names if n.endswith(".py")}
    except (zipfile.BadZipFile, KeyError, ValueError, EOFError) as exc:
        if isinstance(exc, UnsafeModelError):
            raise
        raise ValueError(f"the model blob is not a TorchScript archive: {exc}") from None
    if not any("/code/" in n for n in sources):
        raise ValueError("the model blob is not a TorchScript archive: it holds no code/")
    for name, source in sources.items():
        if b"__setstate__" in source:
            raise UnsafeModelError(f"the model's code ({name}) defines __setstate__, which torch.jit.load runs "
                                   "while loading; models with custom serialization are not accepted")


def load(data, map_location="cpu"):
    """The ScriptModule of archive bytes `data`, after `check_archive` and `check_module`."""
    check_archive(data)
    try:
        module = torch.jit.load(io.BytesIO(data), map_location=map_location)
    except RuntimeError as exc:   # an unknown op or class, malformed code: torch explains in its first line
        lines = str(exc).strip().splitlines()
        raise ValueError(f"cannot load the TorchScript model: {lines[0] if lines else type(exc).__name__}") from None
    check_module(module)
    return module


def check_module(module):
    """Refuse a ScriptModule any of whose methods or hooks, inlined, holds a node outside the allow-list."""
    for path, submodule in module.named_modules():
        prefix = f"{path}." if path else ""
        scripted = submodule._c
        graphs = [(prefix + name, scripted._get_method(name).inlined_graph) for name in scripted._method_names()]
        for hook in (*scripted._get_forward_pre_hooks(), *scripted._get_forward_hooks()):
            graph = hook.graph.copy()
            torch._C._jit_pass_inline(graph)
            graphs.append((f"{prefix}{hook.name} (a hook)", graph))
        for where, graph in graphs:
            _check_block(graph, where)


def _check_block(block, where):
    for node in block.nodes():
        reason = refusal(node)
        if reason is not None:
            raise UnsafeModelError(f"the model's {where} calls {node.kind()}, {reason}: providers run only pure "
                                   "tensor code (aten math, prim control flow)")
        for inner in node.blocks():
            _check_block(inner, where)


def refusal(node):
    """Why `node` (a torch._C.Node) is refused, or None if it is allowed."""
    kind = node.kind()
    if kind in PRIM_KINDS:
        return None
    if not kind.startswith("aten::"):
        return "which is not on the allow-list"
    text = node.schema()
    if text == "(no schema)":
        return "which has no known schema"
    schema = torch._C.parse_schema(text)
    for value in (*schema.arguments, *schema.returns):
        for kind_name in _type_kinds(value.type):
            if kind_name not in VALUE_TYPES:
                return f"which works on {kind_name.replace('Type', '')} objects, not tensors and numbers"
            if kind_name == "StringType" and kind not in STRING_OPS:
                return "which takes a string (a path?) and is not a reviewed string-taking op"
    return None


def _type_kinds(type_):
    stack, kinds = [type_], []
    while stack:
        t = stack.pop()
        kinds.append(type(t).__name__)
        stack.extend(t.containedTypes())
    return kinds
