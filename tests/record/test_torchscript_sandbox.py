"""Issue 44: a 1.2 KB TorchScript archive whose code nests one expression 100,000 deep crashed torch's parser
(SIGSEGV) inside `torch.jit.load`, and so every worker that took it. Now an archive from outside is looked at
without torch first (brackets and indentation bounded), then loaded in a sandboxed child; only on its OK does the
process load it. The requester refuses it at `R.model` without crashing; sent past the requester, it fails its
graph with a reason naming the model, every worker stays up, and a valid graph runs after it."""
import hashlib
import io
import zipfile

import pytest
import torch
from torch import nn

import ravop as R
from ravop.core.node import Node
from ravop.ops import torchscript_safety
from ravop.ops.torchscript_safety import UnsafeModelError
from ravop.wire import encode_params
from ravdl.v2 import Pytorch_Model

from helpers import assert_a_valid_graph_runs, upload_subgraph, wait_until_finished

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def archive(module):
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    return buffer.getvalue()


def rewritten(data, rewrite):
    """`data` with `rewrite(text)` applied to the code of its top module (a valid archive made by torch)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            text = src.read(info)
            if info.filename.endswith(".py") and "/code/__torch__/" in info.filename:
                text = rewrite(text)
            dst.writestr(info, text)
    return out.getvalue()


def nested(depth, unary=False):
    """A Linear's archive whose forward's input is nested `depth` deep: in brackets (the issue's case) or as a
    chain of unary minus, which no bracket count sees (an even depth keeps the value)."""
    expr = ("- " * depth + "input") if unary else ("(" * depth + "input" + ")" * depth)
    return rewritten(archive(nn.Linear(2, 2)), lambda t: t.replace(b"torch.linear(input", b"torch.linear(" +
                                                                       expr.encode()))


def test_the_issue_s_archive_is_refused_before_any_parser_and_1000_deep_still_loads():
    deep = nested(100_000)
    assert len(deep) < 4096
    with pytest.raises(UnsafeModelError, match=r"nests brackets over 2000 deep \(the model [0-9a-f]{12}\)"):
        torchscript_safety.load(deep)
    with pytest.raises(UnsafeModelError, match="nests brackets"):
        R.model(deep)                         # the requester refuses it, and lives
    module = torchscript_safety.load(nested(1000))
    x = torch.randn(3, 2)
    model = R.model(nested(1000))
    assert module(x).shape == (3, 2) and model.model_hash


def test_what_the_pre_check_misses_crashes_only_the_sandbox():
    deep = nested(100_000, unary=True)
    torchscript_safety.check_archive(deep)   # no bracket nesting: the pre-check lets it through
    digest = hashlib.sha256(deep).hexdigest()[:12]
    with pytest.raises(UnsafeModelError, match=f"the model {digest} was refused: loading its code crashed with "
                                               "SIGSEGV in a sandboxed check"):
        torchscript_safety.load(deep)
    with pytest.raises(UnsafeModelError, match="crashed with SIGSEGV"):   # the verdict is kept: once per model
        R.model(deep)


def test_a_sandbox_that_times_out_refuses_and_is_not_remembered(monkeypatch):
    monkeypatch.setattr(torchscript_safety, "SANDBOX_SECONDS", 0.5)   # importing torch alone takes longer
    data = archive(nn.Linear(3, 3))
    with pytest.raises(UnsafeModelError, match=r"took over 0.5 s in a sandbox"):
        torchscript_safety.check_in_sandbox(data)
    monkeypatch.setattr(torchscript_safety, "SANDBOX_SECONDS", 120)
    torchscript_safety.check_in_sandbox(data)    # a timeout may be a busy machine: checked again, and it passes


def test_the_sandbox_s_memory_is_bounded(monkeypatch):
    data = archive(nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024)))   # 8 MiB of weights to load
    monkeypatch.setattr(torchscript_safety, "SANDBOX_MEMORY", (6 << 20) - 4 * len(data))   # a 4 MiB stack and 2
    with pytest.raises(UnsafeModelError, match=r"(needs more memory than the sandbox's bound|can't start new "
                                               r"thread).*the model " + hashlib.sha256(data).hexdigest()[:12]):
        torchscript_safety.load(data)
    monkeypatch.setattr(torchscript_safety, "SANDBOX_MEMORY", 1 << 30)
    torchscript_safety._verdicts.clear()
    assert isinstance(torchscript_safety.load(data), torch.jit.ScriptModule)


def forward_node(data, source):
    params = {"model_hash": hashlib.sha256(data).hexdigest(), "param_slots": [], "buffer_slots": [], "n_args": 1,
              "kwarg_names": [], "training": False, "seed": 0}
    return Node(id=3, op="torchscript_forward", inputs=[1, 2], pkey=encode_params(params), source=source)


def test_deep_archives_fail_their_graphs_on_real_workers_and_every_worker_serves_on(engine, workers, client):
    names = workers.start(3)
    cases = {"brackets": (nested(100_000), b"nests brackets over 2000 deep"),
             "unary": (nested(100_000, unary=True), b"crashed with SIGSEGV in a sandboxed check")}
    for case, (data, reason) in cases.items():
        keys = upload_subgraph(client, engine.token, f"deep-{case}", [forward_node(data, "evil.py:1")],
                               inputs=[1, 2], outputs=[3],
                               constants={1: torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                          2: torch.ones(1, 2)})
        assert wait_until_finished(client, keys) == b"failed", case
        error = client.hget(keys.meta, "error")
        assert reason in error and hashlib.sha256(data).hexdigest()[:12].encode() in error, error
        assert all(workers.alive(name) for name in names), case
    assert_a_valid_graph_runs()


def test_a_valid_model_runs_as_before_through_the_sandbox(engine, workers):
    workers.start(1)
    net = nn.Sequential(nn.Linear(4, 3), nn.Tanh())
    data = archive(net)
    model_op = R.model(data)   # from bytes: sandboxed in the requester and on the worker
    R.Graph(name="valid")
    x = torch.randn(5, 4)
    Pytorch_Model(model_op)._forward_pass(R.t(x)).persist_op("y")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    torch.testing.assert_close(R.fetch_persisting_op("y"), net(x), rtol=0, atol=1e-6)


class AddsAConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.ones(3)

    def forward(self, x):
        return x + self.c


def test_tensor_entries_of_traced_models_are_data_not_code():
    """A traced model stores its constants and example inputs as `constants/0` and `traced_inputs/0`: tensor
    storages like `data/0`, which the code bound does not count."""
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.trace(AddsAConstant(), torch.zeros(3)), buffer)
    names = zipfile.ZipFile(io.BytesIO(buffer.getvalue())).namelist()
    assert "archive/constants/0" in names
    assert all(torchscript_safety._is_tensor_data(n) for n in names if n.rsplit("/", 1)[-1].isdigit())
    assert torch.equal(torchscript_safety.load(buffer.getvalue())(torch.zeros(3)), torch.ones(3))
