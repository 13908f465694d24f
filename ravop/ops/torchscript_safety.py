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

torch's own parser runs on the archive's code inside `torch.jit.load`, before any of these checks, and it
recurses: code nested 100,000 deep crashes the process (SIGSEGV). So an archive from outside is first looked at
without torch (`check_archive`: entries, sizes, compression ratio, names, and the nesting of brackets and
indentation in its code), then loaded and checked in a sandboxed child process (`check_in_sandbox`: memory, CPU
time, wall time and stack bounded); only on its OK does this process load it. A crash or timeout of the child
refuses the model (`UnsafeModelError` naming it). Verdicts are kept per `check_key` (the sha256 of the exact bytes
and of what the check ran under): once per model per process, and, where a worker gives `remember_accepted` a
store (worker/execute/model_verdicts.py), acceptances once per model per machine.
"""
import hashlib
import io
import json
import logging
import os
import re
import resource
import subprocess
import sys
import threading
import zipfile
import zlib
from typing import Optional, Protocol

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


MAX_ENTRIES = 65536            # zip entries: one per tensor storage, code file and a few records
MAX_CODE_BYTES = 64 << 20       # all code (.py) and records (.pkl, version...) of an archive, uncompressed
MAX_RATIO = 200                 # uncompressed / compressed size of a compressed entry (torch stores, never deflates)
MAX_NESTING = 2000              # brackets open at once in the code (an issue's archive: 100,000; 1,000 loads fine)
MAX_INDENT = 2000               # columns of indentation of a line of code
MAX_NAME = 1024                 # characters of an entry's name
SANDBOX_SECONDS = 120           # wall time of the sandboxed check; CPU time is bounded at half of it
SANDBOX_MEMORY = 1 << 30        # bytes the sandboxed check may allocate past its start, plus 4x the archive
SANDBOX_STACK = 4 << 20         # stack of the sandboxed load: half this process's default, so what loads there
                                # has room here
MAX_VERDICTS = 4096             # verdicts kept, the oldest dropped first
_verdicts = {}                  # sha256 of an archive -> None (it loads and passes) or (kind, refusal's message)
_verdicts_lock = threading.Lock()
_accepted = None                # digests accepted by earlier processes of this machine (`remember_accepted`)
sandbox_runs = 0                # sandboxed children started by this process (for tests and logs)
# The checking code itself is part of every verdict's key: a changed allow-list or bound re-checks every model.
with open(__file__, "rb") as _source:
    _CHECKER = hashlib.sha256(_source.read()).hexdigest()

log = logging.getLogger(__name__)


def check_archive(data):
    """Refuse, before loading and without torch, an archive that is not one, that holds duplicate entries, too
    many entries, an entry that inflates past `MAX_RATIO`, an odd name (absolute, `..`, a backslash, a control
    character), code over `MAX_CODE_BYTES`, nested past `MAX_NESTING` brackets or indented past `MAX_INDENT`, or
    whose code defines `__setstate__` (run by torch.jit.load itself)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
        if len(infos) > MAX_ENTRIES:
            raise UnsafeModelError(f"the model archive holds {len(infos)} entries, over {MAX_ENTRIES}")
        names = [info.filename for info in infos]
        duplicates = sorted({n for n in names if names.count(n) > 1}) if len(set(names)) < len(names) else []
        if duplicates:
            raise UnsafeModelError(f"the model archive holds duplicate entries {duplicates[:3]}: which copy "
                                   "torch would read is not the one checked")
        code_bytes = 0
        for info in infos:
            _check_entry(info)
            if not _is_tensor_data(info.filename):
                code_bytes += info.file_size
        if code_bytes > MAX_CODE_BYTES:
            raise UnsafeModelError(f"the model archive's code and records are {code_bytes} bytes uncompressed, "
                                   f"over {MAX_CODE_BYTES}")
        sources = {n: archive.read(n) for n in names if n.endswith(".py")}
    except (zipfile.BadZipFile, KeyError, ValueError, EOFError, RuntimeError, NotImplementedError, zlib.error) as exc:
        if isinstance(exc, UnsafeModelError):
            raise
        raise ValueError(f"the model blob is not a TorchScript archive: {exc}") from None
    if not any("/code/" in n for n in sources):
        raise ValueError("the model blob is not a TorchScript archive: it holds no code/")
    for name, source in sources.items():
        if b"__setstate__" in source:
            raise UnsafeModelError(f"the model's code ({name}) defines __setstate__, which torch.jit.load runs "
                                   "while loading; models with custom serialization are not accepted")
        _check_nesting(name, source)


def _is_tensor_data(name):
    """A tensor's storage (`data/0`, `constants/0`, `traced_inputs/0`): not code, not bounded by MAX_CODE_BYTES."""
    return name.rsplit("/", 1)[-1].isdigit()


def _check_entry(info):
    name = info.filename
    if (len(name) > MAX_NAME or name.startswith("/") or "\\" in name or ".." in name.split("/")
            or any(ord(c) < 32 or ord(c) == 127 for c in name)):
        raise UnsafeModelError(f"the model archive holds an entry with an odd name {name[:80]!r}")
    if info.compress_type == zipfile.ZIP_STORED:
        if info.file_size != info.compress_size:
            raise UnsafeModelError(f"the model archive's entry {name[:80]!r} is stored with {info.compress_size} "
                                   f"bytes but declares {info.file_size}")
    elif info.file_size > MAX_RATIO * info.compress_size + (1 << 20):
        raise UnsafeModelError(f"the model archive's entry {name[:80]!r} inflates {info.compress_size} bytes to "
                               f"{info.file_size} (a zip bomb?)")


_NOT_BRACKETS = bytes(range(256)).translate(None, b"()[]{}'\"\\\n")   # every byte but these, to delete


def _check_nesting(name, source):
    """Refuse code nested past MAX_NESTING brackets or indented past MAX_INDENT columns, before a parser that
    recurses sees it. Strings are skipped roughly (a quote toggles; a backslash skips what follows)."""
    longest = max((len(line) - len(line.lstrip(b" \t")) for line in source.split(b"\n")), default=0)
    if longest > MAX_INDENT:
        raise UnsafeModelError(f"the model's code ({name}) is indented {longest} columns deep, over {MAX_INDENT}")
    depth = deepest = 0
    quote = None
    escaped = False
    for c in source.translate(None, _NOT_BRACKETS):
        if quote is not None:
            if escaped:
                escaped = False
            elif c == 92:       # backslash
                escaped = True
            elif c == quote or c == 10:
                quote = None
        elif c in (34, 39):     # " '
            quote = c
        elif c in (40, 91, 123):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_NESTING:
                    raise UnsafeModelError(f"the model's code ({name}) nests brackets over {MAX_NESTING} deep")
        elif c in (41, 93, 125):
            depth -= 1


class AcceptedStore(Protocol):
    """Where a machine's workers keep the keys of archives they accepted (worker/execute/model_verdicts.py)."""

    def __contains__(self, key: object) -> bool: ...

    def add(self, key: str) -> None: ...


def check_key(data: bytes) -> str:
    """The sha256 hex digest of archive bytes `data` together with what a check of them runs under (the sandbox's
    limits, torch's version, this module's code): equal keys, the same bytes checked the same way."""
    header = json.dumps([SANDBOX_SECONDS, SANDBOX_MEMORY, SANDBOX_STACK, torch.__version__, _CHECKER])
    digest = hashlib.sha256(header.encode() + b"\0")
    digest.update(data)
    return digest.hexdigest()


def remember_accepted(store: Optional[AcceptedStore]) -> None:
    """Keep acceptances in `store` too (`key in store`, `store.add(key)`: a worker's file of digests shared by its
    machine's worker processes), and skip the sandbox for a key it holds; None: this process's memory only."""
    global _accepted
    _accepted = store


def check_in_sandbox(data):
    """Load `data` and run `check_module` on it in a child process with bounded memory, CPU and wall time and a
    smaller stack than this process's: raise UnsafeModelError (or ValueError for a malformed archive) with the
    child's reason, or for its crash or timeout. Each `check_key` is checked once per process, and once per
    machine where `remember_accepted` was given a store: only acceptances are shared."""
    global sandbox_runs
    key = check_key(data)
    with _verdicts_lock:
        if key in _verdicts:
            verdict = _verdicts[key]
        elif _accepted is not None and key in _accepted:
            log.info("the model %s was accepted before on this machine (same bytes, same check): no sandbox", key[:12])
            verdict = _verdicts[key] = None
        else:
            sandbox_runs += 1
            verdict = _run_sandbox(data, hashlib.sha256(data).hexdigest())
            if verdict is None or verdict[0] != "timeout":   # a busy machine may pass it next time
                _verdicts[key] = verdict
                if len(_verdicts) > MAX_VERDICTS:
                    del _verdicts[next(iter(_verdicts))]
            if verdict is None and _accepted is not None:
                _accepted.add(key)
    if verdict is not None:
        kind, message = verdict
        raise (ValueError if kind == "invalid" else UnsafeModelError)(message)


def trust(data):
    """Note archive bytes this process made itself from a module it holds (R.model of a live module): no sandbox."""
    with _verdicts_lock:
        _verdicts[check_key(data)] = None


# What the child needs to find python and torch, and nothing else of this process (no Redis URL, no secrets).
_SANDBOX_ENV = {**{k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH",
                                                              "VIRTUAL_ENV", "HOME", "TMPDIR", "LANG")},
                "OMP_NUM_THREADS": "1"}


def _run_sandbox(data, digest):
    code = ("import importlib.util as u; s = u.spec_from_file_location('ravop_torchscript_sandbox', "
            f"{os.path.abspath(__file__)!r}); m = u.module_from_spec(s); s.loader.exec_module(m); "
            f"m._sandbox_main({SANDBOX_MEMORY}, {SANDBOX_SECONDS}, {SANDBOX_STACK})")
    named = f"the model {digest[:12]}"
    try:
        done = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, cwd="/",
                              timeout=SANDBOX_SECONDS, env=_SANDBOX_ENV)
    except subprocess.TimeoutExpired:
        return "timeout", f"{named} was refused: loading its code took over {SANDBOX_SECONDS} s in a sandbox"
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            answer = json.loads(lines[-1])
        except ValueError:
            answer = {}
        if answer.get("ok"):
            return None
        if answer.get("kind") in ("unsafe", "invalid"):
            kind, error = _registered_here(answer["kind"], answer["error"])
            return kind, error if digest[:12] in error else f"{error} (the model {digest[:12]})"
    if done.returncode < 0:
        import signal
        try:
            how = f"crashed with {signal.Signals(-done.returncode).name}"
        except ValueError:
            how = f"was killed by signal {-done.returncode}"
    else:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        how = f"failed ({tail[-1][:200] if tail else f'exit status {done.returncode}'})"
    return "unsafe", (f"{named} was refused: loading its code {how} in a sandboxed check (memory, time and "
                      "stack bounded), before this process loaded it")


def _registered_here(kind, error):
    """An op unknown to the fresh child but registered in this process (by Python: never an aten op) is refused as
    off the allow-list, as a load here would be."""
    found = re.search(r"Unknown builtin op: (\w+)::(\w+)", error)
    if found is None or found.group(1) in ("aten", "prim"):
        return kind, error
    try:
        known = torch._C._jit_get_schemas_for_operator(f"{found.group(1)}::{found.group(2)}")
    except RuntimeError:
        known = []
    if not known:
        return kind, error
    return "unsafe", (f"the model's code calls {found.group(1)}::{found.group(2)}, which is not on the allow-list: "
                      "providers run only pure tensor code (aten math, prim control flow)")


def _sandbox_main(memory, seconds, stack):
    """The child of `check_in_sandbox`: archive bytes on stdin, one JSON line on stdout; the parent's limits."""
    data = sys.stdin.buffer.read()
    with open("/proc/self/status") as status:
        held = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:")), 0)
    limit = max(held + memory + 4 * len(data), held)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    cpu = max(int(seconds) // 2, 1)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    torch.set_num_threads(1)
    answer = {"ok": True}

    def check():
        try:
            check_module(_jit_load(data, "cpu"))
        except UnsafeModelError as exc:
            answer.update(ok=False, kind="unsafe", error=str(exc))
        except MemoryError:
            answer.update(ok=False, kind="unsafe", error=f"loading the model's code needs more memory than the "
                          f"sandbox's bound ({memory >> 20} MiB and 4x the archive)")
        except (ValueError, RecursionError) as exc:
            answer.update(ok=False, kind="invalid", error=str(exc) or type(exc).__name__)
        except Exception as exc:  # whatever torch raises on hostile bytes is a refusal, said as such
            answer.update(ok=False, kind="invalid", error=f"cannot load the TorchScript model: {exc}"[:500])

    threading.stack_size(stack)
    thread = threading.Thread(target=check)
    thread.start()
    thread.join()
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def _jit_load(data, map_location):
    try:
        return torch.jit.load(io.BytesIO(data), map_location=map_location)
    except RuntimeError as exc:   # an unknown op or class, malformed code: torch explains in its first line
        lines = str(exc).strip().splitlines()
        raise ValueError(f"cannot load the TorchScript model: {lines[0] if lines else type(exc).__name__}") from None


def load(data, map_location="cpu"):
    """The ScriptModule of archive bytes `data`, after `check_archive`, `check_in_sandbox` and `check_module`."""
    try:
        check_archive(data)
    except UnsafeModelError as exc:
        raise UnsafeModelError(f"{exc} (the model {hashlib.sha256(data).hexdigest()[:12]})") from None
    check_in_sandbox(data)
    module = _jit_load(data, map_location)
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
