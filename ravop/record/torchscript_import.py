"""`R.model(source)`: a PyTorch model as graph values, for `ravdl.v2.Pytorch_Model` to train.

A source is one of
- a TorchScript archive (`torch.jit.save`): a file path, bytes, or an http(s) URL, downloaded with
  `requests` (streamed, at most `max_bytes`); `sha256=` checks the file's bytes when given;
- an `nn.Module`: scripted for the user with `torch.jit.script` (a module that cannot be scripted can be
  traced by the user with `torch.jit.trace` and passed as the resulting ScriptModule); its tensors are shared,
  not copied (as `R.t` shares a tensor): `R.activate()` uploads what they hold then;
- a `torch.export` program (`.pt2`, a local file or bytes only): its module is traced to TorchScript with
  the example inputs saved in the program. `torch.export.load` may unpickle, so a `.pt2` is never taken
  from a URL; the traced module runs in the mode the program was exported in (the `training` flag of a
  forward does not switch it), with the shapes the export did not mark dynamic fixed.
Files are recognised by their contents, not their names. A `torch.save` pickle is refused: loading one can
run arbitrary code.

The module is split in two: its code, saved once with empty parameter and buffer slots, becomes one uint8
constant (the "blob", named by its sha256, the same bytes in every process (record/canonical_archive.py), so
workers load, check and cache it once per architecture and machine); the
parameters and buffers become ordinary graph tensors, in `named_parameters()` / `named_buffers()` order,
which training replaces like any layer's. Tied parameters (one tensor in several slots) are one value.
A model whose code is more than pure tensor computation (file ops, custom ops, forks: see
ravop/ops/torchscript_safety.py) is refused here, and again by workers and when a saved model is loaded.

`Model.forward` records one `torchscript_forward` op (ravop/ops/torchscript.py). Its output shapes are
found by running the model once on the requester per input shapes, on zero-filled tensors (a model of at most
256 MiB of inputs: meta kernels import torch._dynamo) or on meta tensors (no compute); the FLOPs counted then feed
the cost model (ravop/ops/torchscript.py, `_probe`).
"""
import contextlib
import hashlib
import io
import os
import warnings
import weakref
import zipfile

import torch

from ..client.saved_model import SavedModel
from ..client.session import LOADERS
from ..core import op_functions as R
from ..core.errors import ShapeError
from ..ops import torchscript, torchscript_safety
from ..runtime.evaluate import op_seed
from .canonical_archive import sorted_constants
from .graph import as_op, current_graph
from .source import user_source

DEFAULT_MAX_BYTES = 1 << 30
# The one deprecation warning R.model gives, and only for TorchScript the user passed in.
TORCHSCRIPT_DEPRECATED = ("R.model: PyTorch deprecates TorchScript (torch.jit); this model still loads and "
                          "trains, but for new code pass the nn.Module itself (R.model(module)) or a "
                          "torch.export .pt2 program")
BUNDLE_KIND = "ravdl.torchscript"   # a model saved by ravdl.v2.Pytorch_Model.save_model
BLOB_KEY = "@code"   # the blob's key in a saved bundle; the other keys are slot names, which never hold "@"


@contextlib.contextmanager
def _internal_jit():
    """Around the torch.jit calls this module makes for its own purposes (scripting a module it was given,
    re-saving an archive, loading a saved model's code): torch deprecates TorchScript, but a user who
    passed an nn.Module or fetched a model did not ask for it, so the warnings are not theirs to see."""
    with warnings.catch_warnings():
        for category in (DeprecationWarning, FutureWarning):   # torch 2.14 warns with FutureWarning
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=category)
        yield


def model(source, *, sha256=None, max_bytes=DEFAULT_MAX_BYTES, timeout=60.0):
    """A `Model` from a TorchScript file/bytes/URL, an nn.Module or a torch.export `.pt2` file (see the
    module docstring). `sha256`: the expected hex digest of the file's bytes; `max_bytes` bounds a
    download; `timeout` (seconds) bounds each network read."""
    if isinstance(source, torch.nn.Module):
        if sha256 is not None:
            raise ValueError("sha256= checks a file's bytes; it does not apply to a module object")
        if isinstance(source, torch.jit.ScriptModule):
            warnings.warn(TORCHSCRIPT_DEPRECATED, DeprecationWarning, stacklevel=2)
        result = _from_module(source)
        if not isinstance(source, torch.jit.ScriptModule):
            result.module = source
        return result
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, from_network = bytes(source), False
    elif isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        from_network = isinstance(text, str) and text.lower().startswith(("http://", "https://"))
        data = _download(text, max_bytes, timeout) if from_network else _read_file(text)
    else:
        raise TypeError(f"R.model takes a file path, an http(s) URL, bytes or an nn.Module, not "
                        f"{type(source).__name__}")
    if sha256 is not None:
        digest = hashlib.sha256(data).hexdigest()
        if digest != str(sha256).lower():
            raise ValueError(f"model file has sha256 {digest}, expected {sha256}")
    kind = _kind(data)
    if kind == "export":
        if from_network:
            raise ValueError("a torch.export .pt2 program is not loaded from a URL: torch.export.load may "
                             "unpickle it, which can run code; download it, check it, and pass the local path")
        return _from_module(_trace_export(data))
    warnings.warn(TORCHSCRIPT_DEPRECATED, DeprecationWarning, stacklevel=2)
    return _from_archive(data)


def _read_file(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise FileNotFoundError(f"cannot read model file {path!r}: {exc.strerror}") from None


def _download(url, max_bytes, timeout):
    import requests  # only a URL source needs it

    try:
        with requests.get(url, stream=True, timeout=timeout) as response:
            response.raise_for_status()
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                raise ValueError(f"model at {url} is {int(declared)} bytes, more than max_bytes={max_bytes}")
            chunks, size = [], 0
            for chunk in response.iter_content(chunk_size=1 << 20):
                size += len(chunk)
                if size > max_bytes:  # the header may lie or be absent; count what actually arrives
                    raise ValueError(f"model at {url} is more than max_bytes={max_bytes} bytes")
                chunks.append(chunk)
    except requests.RequestException as exc:
        raise ConnectionError(f"cannot download model from {url}: {exc}") from None
    return b"".join(chunks)


def _kind(data):
    """'torchscript' or 'export' from the zip archive's entries; a clear error for anything else."""
    try:
        names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    except zipfile.BadZipFile:
        raise ValueError("not a model archive: expected a TorchScript file (torch.jit.save) or a torch.export "
                         ".pt2 program") from None
    if any(n.endswith("/models/model.json") for n in names):
        return "export"
    if any("/code/" in n for n in names) and any(n.endswith("/constants.pkl") for n in names):
        return "torchscript"
    raise ValueError("not a TorchScript archive (a torch.save pickle is refused: loading it can run code); "
                     "save the model with torch.jit.save(torch.jit.script(model), path)")


def _trace_export(data):
    program = torch.export.load(io.BytesIO(data))
    if program.example_inputs is None:
        raise ValueError("the .pt2 program holds no example inputs to trace it with; pass the nn.Module "
                         "(R.model(module)) or a TorchScript file instead")
    args, kwargs = program.example_inputs
    try:
        with _internal_jit():
            # The export's shape guards become trace constants: expected, not worth a warning.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return torch.jit.trace(program.module(), args, example_kwarg_inputs=kwargs or None)
    except Exception as exc:  # tracing runs arbitrary model code: any failure means "cannot use this program"
        raise ValueError(f"cannot turn the .pt2 program into TorchScript by tracing: {exc}") from None


def _from_module(module):
    with _internal_jit():
        if not isinstance(module, torch.jit.ScriptModule):
            try:
                module = torch.jit.script(module)   # shares the module's tensors: no copy of its values
            except Exception as exc:  # the TorchScript compiler raises many kinds of errors
                raise TypeError(f"cannot script {type(module).__name__} with torch.jit.script ({exc}); trace "
                                "it with torch.jit.trace(module, example_inputs) and pass the result") from None
        return _split(module)


def _groups(named):
    """(slots, tensor) per distinct tensor, in first-seen order: a tied tensor fills several slots."""
    groups = {}
    for slot, tensor in named:
        groups.setdefault(id(tensor), (tensor, []))[1].append(slot)
    return [(tuple(slots), tensor) for tensor, slots in groups.values()]


def _from_archive(data):
    with _internal_jit():
        return _split(torchscript_safety.load(data))


def _split(module: torch.jit.ScriptModule) -> "Model":
    """The `Model` of a ScriptModule: its code saved once with empty parameter and buffer slots (the blob), and
    its values as they are, not copied (the caller's module keeps holding them: the user's memory, as in eager;
    a CPU module's tensors are shared, as `R.t` shares a tensor, so R.activate() uploads what they hold then).
    The slots are emptied only while the code is saved, then restored."""
    params = _groups(module.named_parameters(remove_duplicate=False))
    buffers = _groups(module.named_buffers(remove_duplicate=False))
    owners = [(torchscript.slot_owner(module, slot), tensor) for slots, tensor in params + buffers for slot in slots]
    try:
        for (owner, name), tensor in owners:
            setattr(owner, name, torch.empty(0, dtype=tensor.dtype))
        saved = _saved(module)
    finally:
        for (owner, name), tensor in owners:
            setattr(owner, name, tensor)
    # The code alone (small), its constants in a fixed order, loaded and saved once more: the blob of a module
    # loaded from an archive, so that one architecture has one blob (and hash) whether it came as a file or as a
    # module (a scripted module saves other debug records), in every process. It is also the module the
    # requester's shape rule runs, never the caller's.
    saved = sorted_constants(saved)
    torchscript_safety.trust(saved)
    code = torchscript_safety.load(saved)
    blob = _saved(code)
    model_hash = hashlib.sha256(blob).hexdigest()
    torchscript.remember(model_hash, code)
    return Model(torch.frombuffer(bytearray(blob), dtype=torch.uint8), model_hash,
                 [(slots, t.detach().cpu()) for slots, t in params], [bool(t.requires_grad) for _, t in params],
                 [(slots, t.detach().cpu()) for slots, t in buffers])


def _saved(module: torch.jit.ScriptModule) -> bytes:
    """The archive bytes of `module`, noted as made by this process from a module it holds (no sandbox for them)."""
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    torchscript_safety.trust(buffer.getvalue())
    return buffer.getvalue()


class Model:
    """What `R.model` returns: a model's code (`blob`, uint8, named by its sha256 `model_hash`) and its
    initial parameter and buffer values (host tensors, in slot order). `forward` records a call."""

    def __init__(self, blob, model_hash, params, requires_grad, buffers):
        self.blob = blob
        self.model_hash = model_hash
        self.param_slots = tuple(slots for slots, _ in params)
        self.params = tuple(t for _, t in params)
        self.requires_grad = tuple(requires_grad)
        self.buffer_slots = tuple(slots for slots, _ in buffers)
        self.buffers = tuple(t for _, t in buffers)
        self._blob_ops = weakref.WeakKeyDictionary()  # graph -> its constant holding `blob`
        # The nn.Module given to R.model, if one was: Pipeline traces it with torch.fx to cut a forward that is
        # not a chain of its children (ravop/record/graph_stages.py); TorchScript has no such trace.
        self.module = None

    @property
    def param_names(self):
        return tuple(slots[0] for slots in self.param_slots)

    @property
    def buffer_names(self):
        return tuple(slots[0] for slots in self.buffer_slots)

    def __repr__(self):
        return (f"<Model {self.model_hash[:12]} {len(self.params)} params "
                f"({sum(p.numel() for p in self.params)} values), {len(self.buffers)} buffers>")

    def blob_op(self, graph=None):
        """The constant holding the model's code in `graph` (the current graph by default), made once."""
        graph = graph or current_graph()
        op = self._blob_ops.get(graph)
        if op is None:
            op = self._blob_ops[graph] = graph.constant(self.blob, user_source())
        return op

    def forward(self, params, buffers, args, kwargs=None, training=False, seed=None):
        """Record one call `model(*args, **kwargs)` with parameter and buffer values `params`, `buffers`
        (Ops, in slot order); its dropout draws from `seed` if given (a pipeline stage's forward and its recompute
        share one), else from the op's own stream. Returns (output, buffers after the call): the output is one
        Op, or a tuple when the model returns a tuple; in training mode the buffers are new Ops (updated running
        stats), else the given ones."""
        if len(params) != len(self.params) or len(buffers) != len(self.buffers):
            raise ValueError(f"the model has {len(self.params)} parameters and {len(self.buffers)} buffers; "
                             f"got {len(params)} and {len(buffers)}")
        graph = current_graph()
        kwargs = kwargs or {}
        xs = [self.blob_op(graph), *params, *buffers, *(as_op(a, graph) for a in args),
              *(as_op(v, graph) for v in kwargs.values())]
        p = {"model_hash": self.model_hash, "param_slots": self.param_slots, "buffer_slots": self.buffer_slots,
             "n_args": len(args), "kwarg_names": tuple(kwargs), "training": bool(training),
             "seed": op_seed(graph.seed, len(graph.nodes)) if seed is None else int(seed)}   # the id it is about to get
        try:
            found = torchscript.probe(xs, p)
        except (ValueError, TypeError, RuntimeError, NotImplementedError) as exc:
            shapes = ", ".join(str(tuple(x.shape)) for x in xs[1 + len(params) + len(buffers):])
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            # A TorchScript error is a long traceback ending with the cause: put the cause first.
            detail = f"\nthe model's traceback:\n{exc}" if len(lines) > 1 else ""
            raise ShapeError(f"torchscript_forward: {lines[-1]} (input shapes: {shapes}) at {user_source()}"
                             f"{detail}") from None
        results = R.torchscript_forward(xs, **p)
        outputs = results[:len(found.specs)]
        new_buffers = list(results[len(found.specs):]) if training else list(buffers)
        return (outputs[0] if found.single else tuple(outputs)), new_buffers


def load_module(spec, tensors):
    """Rebuild a saved model (see `ravdl.v2.Pytorch_Model.save_model`): a plain nn.Module (`SavedModel`)
    holding the saved parameter and buffer values under their original names, in eval mode."""
    data = tensors[BLOB_KEY].cpu().numpy().tobytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec["model_hash"]:
        raise ValueError(f"saved model blob has sha256 {digest}, its spec names {spec['model_hash']}")
    with _internal_jit():
        code = torchscript_safety.load(data)
    params = [([*slots], torch.nn.Parameter(tensors[slots[0]], requires_grad=bool(grad)))
              for slots, grad in zip(spec["param_slots"], spec["requires_grad"])]
    buffers = [([*slots], tensors[slots[0]]) for slots in spec["buffer_slots"]]
    return SavedModel(code, params, buffers).eval()


LOADERS[BUNDLE_KIND] = load_module
