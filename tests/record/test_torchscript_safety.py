"""Hostile TorchScript: every way found to touch files, fork, print or call custom ops from model code is refused
by R.model, by a worker's kernel and when a saved model is loaded - before any of its code runs; a hostile
blob put straight into a graph fails the graph on a real worker and writes nothing."""
import hashlib
import io
import zipfile
from typing import Tuple

import pytest
import torch
from torch import nn

import ravop as R
from ravop.core.node import Node
from ravop.ops import torchscript
from ravop.ops.torchscript_safety import UnsafeModelError, load
from ravop.record.torchscript_import import BLOB_KEY, load_module
from ravop.wire import encode_params

from helpers import upload_subgraph, wait_until_finished

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

torch.library.define("ravop_test::touch", "(Tensor x) -> Tensor")


@torch.library.impl("ravop_test::touch", "CompositeExplicitAutograd")
def _touch(x):
    return x.clone()


class SavesToItsArgument(nn.Module):
    def forward(self, x, path: str):
        torch.save(x, path)
        return x


class HoldsAPath(nn.Module):
    """A model given the path a hostile method would write."""

    def __init__(self, path):
        super().__init__()
        self.path = path


class SavesWithAtenOp(HoldsAPath):
    def forward(self, x):
        torch.ops.aten.save(x, self.path)
        return x


class ReadsAFile(nn.Module):
    def forward(self, x):
        return x + torch.from_file("/etc/hostname", False, 1, dtype=torch.uint8).float()


class Prints(nn.Module):
    def forward(self, x):
        print(x)
        return x


class Forks(nn.Module):
    def forward(self, x):
        return torch.jit.wait(torch.jit.fork(torch.neg, x))


class CallsCustomOp(nn.Module):
    def forward(self, x):
        return torch.ops.ravop_test.touch(x)


@torch.jit.script
def save_quietly(x, path: str):
    torch.ops.aten.save(x, path)
    return x


class CallsAScriptedFunction(HoldsAPath):
    def forward(self, x):
        return save_quietly(x, self.path)


class Nested(nn.Module):
    def __init__(self, path):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), SavesWithAtenOp(path)))

    def forward(self, x):
        return self.inner(x)


class ExportsABackdoor(HoldsAPath):
    def forward(self, x):
        return x

    @torch.jit.export
    def backdoor(self, x):
        torch.ops.aten.save(x, self.path)
        return x


class SavesOnLoad(HoldsAPath):
    """Its __setstate__ would run inside torch.jit.load."""

    def forward(self, x):
        return x

    @torch.jit.export
    def __getstate__(self):
        return (self.path, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, bool]):
        torch.ops.aten.save(torch.ones(1), state[0])
        self.path = state[0]
        self.training = state[1]


def save_in_hook(module: nn.Module, inputs: Tuple[torch.Tensor], output: torch.Tensor):
    torch.ops.aten.save(output, "/tmp/ravop-hook-was-here")


def hooked():
    net = nn.Linear(2, 2)
    net.register_forward_hook(save_in_hook)
    return net


def archive(module):
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    return buffer.getvalue()


def with_duplicate_entry(data):
    """`data` with a second, different copy of its model code under the same name."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as benign, zipfile.ZipFile(out, "w") as merged:
        for info in benign.infolist():
            merged.writestr(info.filename, benign.read(info))
        [code] = [n for n in benign.namelist() if n.endswith(".py") and "/code/__torch__/" in n]
        with pytest.warns(UserWarning, match="Duplicate name"):
            merged.writestr(code, benign.read(code).replace(b"torch.linear(", b"ops.aten.save("))
    return out.getvalue()


HOSTILE = {
    "torch.save": (lambda p: SavesToItsArgument(), "forward calls aten::save"),
    "aten.save": (SavesWithAtenOp, "forward calls aten::save"),
    "from_file": (lambda p: ReadsAFile(), "forward calls aten::from_file"),
    "print": (lambda p: Prints(), "forward calls prim::Print"),
    "fork": (lambda p: Forks(), "calls prim::fork"),
    "custom op": (lambda p: CallsCustomOp(), "calls ravop_test::touch, which is not on the allow-list"),
    "scripted function": (CallsAScriptedFunction, "forward calls aten::save"),
    "nested module": (Nested, "calls aten::save"),
    "exported method": (ExportsABackdoor, "the model's backdoor calls aten::save"),
    "__setstate__": (SavesOnLoad, "defines __setstate__, which torch.jit.load runs"),
    "hook": (lambda p: hooked(), r"save_in_hook \(a hook\) calls aten::save"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_models_are_refused_by_r_model_workers_and_loaders(case, tmp_path):
    make, message = HOSTILE[case]
    target = tmp_path / "written"
    data = archive(make(str(target)))
    with pytest.raises(UnsafeModelError, match=message):
        R.model(data)
    with pytest.raises(UnsafeModelError, match=message):   # a worker, sent the blob by a graph
        torchscript.torchscript_forward(torch.frombuffer(bytearray(data), dtype=torch.uint8), torch.zeros(2, 2),
                                        model_hash=hashlib.sha256(data).hexdigest(), param_slots=(),
                                        buffer_slots=(), n_args=1, kwarg_names=(), training=False, seed=0)
    spec = {"model_hash": hashlib.sha256(data).hexdigest(), "param_slots": [], "requires_grad": [],
            "buffer_slots": []}
    with pytest.raises(UnsafeModelError, match=message):   # a saved model read back from Redis
        load_module(spec, {BLOB_KEY: torch.frombuffer(bytearray(data), dtype=torch.uint8)})
    assert not target.exists()


def test_an_archive_with_duplicate_entries_is_refused():
    data = with_duplicate_entry(archive(nn.Linear(2, 2)))
    with pytest.raises(UnsafeModelError, match="duplicate entries"):
        R.model(data)


def test_not_an_archive_and_unknown_code_are_clear_errors():
    with pytest.raises(ValueError, match="not a TorchScript archive"):
        load(b"PK\x03\x04 truncated")
    benign = archive(nn.Linear(2, 2))
    broken = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(benign)) as src, zipfile.ZipFile(broken, "w") as dst:
        for info in src.infolist():
            text = src.read(info)
            if info.filename.endswith(".py") and "/code/__torch__/" in info.filename:
                text = text.replace(b"torch.linear(", b"ops.nosuch.op(")
            dst.writestr(info, text)
    with pytest.raises(ValueError, match="cannot load the TorchScript model"):
        load(broken.getvalue())


def test_ordinary_layers_pass_the_allow_list():
    layers = [nn.LSTM(4, 4), nn.GRU(4, 4), nn.TransformerEncoderLayer(8, 2, 16), nn.MultiheadAttention(8, 2),
              nn.Conv2d(1, 2, 3, padding="same"), nn.BatchNorm2d(3), nn.LayerNorm(4), nn.Embedding(5, 4),
              nn.Dropout(0.1), nn.GELU(approximate="tanh"), nn.Upsample(scale_factor=2), nn.GroupNorm(2, 4),
              nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1), nn.ConvTranspose2d(2, 2, 3), nn.PReLU(),
              nn.CrossEntropyLoss(), nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Softmax(1))]
    for layer in layers:
        assert isinstance(load(archive(layer)), torch.jit.ScriptModule), layer


def test_a_hostile_blob_in_a_graph_fails_it_on_a_real_worker(engine, workers, client, tmp_path):
    [name] = workers.start(1)
    target = tmp_path / "written"
    data = archive(SavesWithAtenOp(str(target)))
    params = {"model_hash": hashlib.sha256(data).hexdigest(), "param_slots": [], "buffer_slots": [], "n_args": 1,
              "kwarg_names": [], "training": False, "seed": 0}
    keys = upload_subgraph(client, engine.token, "hostile-model",
                           [Node(id=3, op="torchscript_forward", inputs=[1, 2], pkey=encode_params(params),
                                    source="evil.py:1")],
                           inputs=[1, 2], outputs=[3],
                           constants={1: torch.frombuffer(bytearray(data), dtype=torch.uint8), 2: torch.ones(2)})
    assert wait_until_finished(client, keys) == b"failed"
    assert b"calls aten::save" in client.hget(keys.meta, "error")
    assert not target.exists() and workers.alive(name)
