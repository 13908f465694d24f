"""Issue 46: a worker checks each TorchScript archive in a sandboxed child (6-15 s under load), once per process and
model. A machine's worker processes now share the acceptances: a file of SHA-256 digests of the exact bytes checked
and of the check's limits. The same bytes load without a child in a later process; one byte more is checked again;
a refusal is never kept as an acceptance; a damaged file is ignored as a whole and logged. R.model of a live module
makes the same bytes in every run, so a second run's worker loads it without a child."""
import io
import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from ravop.ops import torchscript_safety
from ravop.ops.torchscript_safety import UnsafeModelError
from worker.execute.model_verdicts import FORMAT, AcceptedModels

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


class Printing(nn.Module):
    def forward(self, x):
        print(x)            # prim::Print: off the allow-list, refused inside the sandbox
        return x


def archive(module):
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    return buffer.getvalue()


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """This process as a fresh worker process of a machine whose accepted models are kept in tmp_path."""
    store = AcceptedModels(str(tmp_path / "accepted_models.json"))
    monkeypatch.setattr(torchscript_safety, "_verdicts", {})
    monkeypatch.setattr(torchscript_safety, "_accepted", store)
    return store


def fresh_process(monkeypatch):
    monkeypatch.setattr(torchscript_safety, "_verdicts", {})   # what a new worker process remembers by itself


def test_the_same_bytes_load_without_a_child_in_the_next_process_and_one_byte_more_is_checked(machine, monkeypatch,
                                                                                              caplog):
    data = archive(nn.Linear(3, 3))
    runs = torchscript_safety.sandbox_runs
    torchscript_safety.load(data)
    assert torchscript_safety.sandbox_runs == runs + 1
    assert torchscript_safety.check_key(data) in machine
    fresh_process(monkeypatch)
    with caplog.at_level(logging.INFO, logger="ravop.ops.torchscript_safety"):
        module = torchscript_safety.load(data)
    assert torchscript_safety.sandbox_runs == runs + 1 and "accepted before on this machine" in caplog.text
    assert module(torch.ones(2, 3)).shape == (2, 3)
    torchscript_safety.load(data + b"\0")   # a zip reader skips trailing bytes; the digest does not
    assert torchscript_safety.sandbox_runs == runs + 2


def test_other_sandbox_limits_check_again(machine, monkeypatch):
    data = archive(nn.Linear(2, 2))
    torchscript_safety.load(data)
    fresh_process(monkeypatch)
    monkeypatch.setattr(torchscript_safety, "SANDBOX_MEMORY", 2 << 30)
    runs = torchscript_safety.sandbox_runs
    torchscript_safety.load(data)
    assert torchscript_safety.sandbox_runs == runs + 1


def test_a_refusal_is_never_kept_as_an_acceptance(machine, monkeypatch):
    data = archive(Printing())
    with pytest.raises(UnsafeModelError, match="prim::Print"):
        torchscript_safety.load(data)
    assert not os.path.exists(machine.path)
    fresh_process(monkeypatch)
    runs = torchscript_safety.sandbox_runs
    with pytest.raises(UnsafeModelError, match="prim::Print"):
        torchscript_safety.load(data)
    assert torchscript_safety.sandbox_runs == runs + 1


@pytest.mark.parametrize("damage", ["truncated", "one entry not a digest", "no format"])
def test_a_damaged_file_is_ignored_as_a_whole_and_logged(machine, monkeypatch, caplog, damage):
    data = archive(nn.Linear(4, 4))
    torchscript_safety.load(data)
    key = torchscript_safety.check_key(data)
    text = {"truncated": json.dumps({"format": FORMAT, "accepted": [key]})[:-3],
            "one entry not a digest": json.dumps({"format": FORMAT, "accepted": [key, "../etc/passwd"]}),
            "no format": json.dumps({"accepted": [key]})}[damage]
    with open(machine.path, "w") as f:
        f.write(text)
    fresh_process(monkeypatch)
    runs = torchscript_safety.sandbox_runs
    with caplog.at_level(logging.WARNING, logger="worker.execute.model_verdicts"):
        torchscript_safety.load(data)
    assert torchscript_safety.sandbox_runs == runs + 1 and "it is damaged" in caplog.text
    with open(machine.path) as f:   # rewritten whole, with the digest just checked
        assert json.load(f) == {"format": FORMAT, "accepted": [key]}


def test_worker_processes_of_one_machine_share_acceptances(tmp_path):
    """Real processes set up as `ravop-worker` sets itself up at start: the second loads without a child."""
    path = tmp_path / "model.pt"
    path.write_bytes(archive(nn.Sequential(nn.Linear(3, 4), nn.ReLU())))
    code = ("from ravop.ops import torchscript_safety as s; from worker.execute import model_verdicts as v; "
            "v.share_acceptances(); "
            f"s.load(open({str(path)!r}, 'rb').read()); print('children', s.sandbox_runs)")
    env = {**os.environ, "RAVOP_MODEL_VERDICTS": str(tmp_path / "verdicts.json")}
    outputs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
               for _ in range(2)]
    assert [o.stdout.split()[-2:] for o in outputs] == [["children", "1"], ["children", "0"]], outputs


# A requester's run: R.model of a live module (torch.nn's, several `Final` constants each), its blob written to
# argv[1], and torch's own archive of the same scripted module to argv[2].
_RECORD = """
import io, sys, torch
from torch import nn
import ravop as R
torch.manual_seed(0)
module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
open(sys.argv[1], "wb").write(bytes(R.model(module).blob.numpy()))
raw = io.BytesIO()
torch.jit.save(torch.jit.script(module), raw)
open(sys.argv[2], "wb").write(raw.getvalue())
"""


def test_r_model_of_a_live_module_makes_the_same_bytes_in_every_run_so_the_second_run_needs_no_child(tmp_path):
    """Two requester runs (other string hashes: torch orders a module's constants by it) make one blob, and a
    worker process of the second run loads it without a sandboxed child: the first run's worker accepted it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "RAVOP_MODEL_VERDICTS": str(tmp_path / "verdicts.json")}
    for run in (1, 2):
        subprocess.run([sys.executable, "-c", _RECORD, str(tmp_path / f"blob{run}"), str(tmp_path / f"raw{run}")],
                       env={**env, "PYTHONHASHSEED": str(run)}, check=True, timeout=300)
    assert (tmp_path / "raw1").read_bytes() != (tmp_path / "raw2").read_bytes()   # torch's own bytes differ
    assert (tmp_path / "blob1").read_bytes() == (tmp_path / "blob2").read_bytes()
    load = ("import sys; from ravop.ops import torchscript_safety as s; from worker.execute import model_verdicts as v; "
            "v.share_acceptances(); s.load(open(sys.argv[1], 'rb').read()); print('children', s.sandbox_runs)")
    outputs = [subprocess.run([sys.executable, "-c", load, str(tmp_path / f"blob{run}")], env=env,
                              capture_output=True, text=True, timeout=300) for run in (1, 2)]
    assert [o.stdout.split()[-2:] for o in outputs] == [["children", "1"], ["children", "0"]], outputs
