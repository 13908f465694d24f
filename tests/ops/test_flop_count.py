"""Issue 46: recording a TorchScript model imported torch._dynamo (2-3 s and 71 MiB in the requester): the shape
probe's meta kernels (batch norm's, layer norm's: torch's Python decompositions) and torch's FLOP counter each
import it on first use. A model of at most `PROBE_ON_CPU_BYTES` is probed on zeros, under `FlopCount`, which counts
by torch's formulas without Dynamo; a larger one still goes on meta tensors (no compute)."""
import subprocess
import sys

import torch
from torch import nn

from ravop.ops import torchscript
from ravop.ops.flop_count import FlopCount

# Run in a fresh interpreter: any earlier test of this process may have imported Dynamo already.
RECORD = """
import sys, torch
from torch import nn
import ravop as R
from ravdl.v2 import Pytorch_Model
R.Graph(name="probe-without-dynamo")
net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.LayerNorm(8 * 30 * 30),
                    nn.Linear(8 * 30 * 30, 10))
out = Pytorch_Model(R.model(net))._forward_pass(R.t(torch.zeros(4, 3, 32, 32)))
print(tuple(out.shape), sorted(m for m in sys.modules if m.startswith("torch._dynamo"))[:3])
"""


def test_recording_a_batch_norm_model_does_not_import_dynamo():
    done = subprocess.run([sys.executable, "-c", RECORD], capture_output=True, text=True, timeout=300)
    assert done.stdout.split("\n")[-2:] == ["(4, 10) []", ""], done.stderr[-2000:]


def test_flop_count_counts_as_torch_s_counter():
    from torch.utils.flop_counter import FlopCounterMode
    model = torch.jit.script(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5)))
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), FlopCount() as ours:
        model(x)
    with torch.no_grad(), FlopCounterMode(display=False) as theirs:
        model(x)
    assert ours.total == theirs.get_total_flops() == 2 * 2 * 8 * 36 * 27 + 2 * 2 * 288 * 5


def test_a_model_past_the_cpu_bound_is_probed_on_meta_tensors(monkeypatch):
    import ravop as R
    from ravdl.v2 import Pytorch_Model
    seen = []
    run = torchscript._run
    monkeypatch.setattr(torchscript, "_run", lambda xs, *a: seen.append(xs[1].device.type) or run(xs, *a))
    monkeypatch.setattr(torchscript, "PROBE_ON_CPU_BYTES", 1000)
    R.Graph(name="probe-on-meta")
    out = Pytorch_Model(R.model(nn.Linear(64, 8)))._forward_pass(R.t(torch.zeros(2, 64)))   # 2 KiB of weights
    assert out.shape == (2, 8) and seen == ["meta"]
