"""Every op the reproducible numerics mode covers, run in this process on fixed inputs: prints one JSON object,
case -> {"mode": digest of the reproducible kernel's outputs, "default": digest of the op's own kernel's,
"gap": their largest difference here, relative, "like": whether their dtypes and shapes agree} or {"error": ...}.

Run it once per CPU class and thread count, each class's variables set before Python starts (its libraries read
them when they load), and compare the digests: tests/ops/test_reproducible_numerics.py and
`bench_reproducible.py --table` do.

    python benchmarks/reproducible_probe.py INPUTS.npz THREADS

Inputs: the registry walk's samples (tests/samples/) at the arrays in INPUTS.npz (`write_inputs`, made once by the
caller: the samples draw them with torch.randn, whose values depend on the CPU class), and larger cases drawn here
with numpy, where thread counts and vector widths change the order of additions (`larger_cases`).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ravop.core import numerics_mode, registry  # noqa: E402
from ravop.record.graph import to_tensor  # noqa: E402
from ravop.runtime.runner import run_op  # noqa: E402
from tests.samples import all_samples  # noqa: E402


def _stored(value: Any) -> np.ndarray:
    """A sample input as stored: a numpy array (float32 for the half types: they convert back exactly)."""
    tensor = to_tensor(value)
    return (tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor).numpy()


def sample_cases() -> Iterator[tuple[str, str, int, Any]]:
    """(case name, op, sample index, sample) of every sample of a covered op."""
    for name, samples in sorted(all_samples().items()):
        opdef = registry.REGISTRY.get(name)
        if opdef is None or opdef.reproducible is None:
            continue
        for i, sample in enumerate(samples):
            yield f"{name}-{i}", name, i, sample


def write_inputs(path: str) -> None:
    """Store the samples' array inputs (this process's draws) in `path` for every probe to read."""
    stored = {}
    for case, _, _, sample in sample_cases():
        for k, value in enumerate(sample.inputs):
            stored[f"{case}/{k}"] = _stored(value)
    np.savez(path, **stored)


def larger_cases() -> dict[str, tuple[str, list[Any], dict[str, Any]]]:
    """case -> (op, inputs, params): the sizes where the default kernels' bits differ by class or thread count."""
    rng = np.random.default_rng(42)

    def f(*shape: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    x4, w4 = f(32, 16, 8, 8), f(32, 16, 3, 3)
    g4 = f(32, 32, 8, 8)
    logits, labels = f(64, 10), torch.from_numpy(rng.integers(0, 10, 64))
    probabilities = torch.from_numpy(rng.dirichlet(np.ones(10), 64).astype(np.float32))
    in_01 = torch.from_numpy(rng.random((64, 1024), dtype=np.float32))   # torch's own tanh/softmax would differ
    wide = f(64, 1024)
    conv = {"stride": 1, "padding": "same", "dilation": 1, "groups": 1, "padding_mode": "zeros"}
    state = [f(256, 64), f(256, 64), f(256, 64) * 0.1, f(256, 64).abs() * 0.01, torch.zeros(256, 64)]
    return {
        "matmul-large": ("matmul", [f(128, 512), f(512, 96)], {}),
        "linear-large": ("linear", [f(64, 784), f(256, 784), f(256)], {}),
        "linear_backward-large": ("linear_backward", [f(64, 256), f(64, 784), f(256, 784)],
                                  {"mask": (True, True, True)}),
        "conv2d-large": ("conv2d", [x4, w4, f(32)], conv),
        "conv2d_backward-large": ("conv2d_backward", [g4, x4, w4], {**conv, "mask": (True, True, True)}),
        "sum-full": ("sum", [f(1000, 1000)], {}),
        "mean-full": ("mean", [f(1000, 1000)], {}),
        "sum-axis0": ("sum", [f(4096, 16)], {"axis": 0}),
        "softmax-64x10": ("softmax", [logits], {"axis": -1}),
        "softmax_backward-64x10": ("softmax_backward", [f(64, 10), probabilities], {"axis": -1}),
        "log_softmax-wide": ("log_softmax", [wide], {"axis": -1}),
        "cross_entropy_loss-64x10": ("cross_entropy_loss", [labels, logits], {}),
        "cross_entropy_loss_backward-64x10": ("cross_entropy_loss_backward", [torch.tensor(1.0), labels, logits],
                                              {"mask": (False, True)}),
        "batch_norm-large": ("batch_norm", [x4, torch.zeros(16), torch.ones(16), f(16), f(16)],
                             {"momentum": 0.99, "eps": 0.01}),
        "batch_norm_backward-large": ("batch_norm_backward", [f(32, 16, 8, 8), x4, torch.zeros(16), torch.ones(16),
                                                              f(16)], {"eps": 0.01, "mask": (True, True, True)}),
        "layer_norm-wide": ("layer_norm", [wide, f(1024), f(1024)], {"normalized_shape": 1024}),
        "layer_norm_backward-wide": ("layer_norm_backward", [f(64, 1024), wide, f(1024), f(1024)],
                                     {"normalized_shape": 1024, "mask": (True, True, True)}),
        "tanh_backward-wide": ("tanh_backward", [wide, in_01 * 2 - 1], {}),
        "sigmoid_backward-wide": ("sigmoid_backward", [wide, in_01], {}),
        "sigmoid-wide": ("sigmoid", [wide], {}),
        "gelu-wide": ("gelu", [wide], {}),
        "gelu_backward-wide": ("gelu_backward", [wide, wide], {}),
        "adam_step-large": ("adam_step", state, {"step": 5}),
        "adamw_step-large": ("adamw_step", state, {"step": 5}),
        "square_loss-large": ("square_loss", [wide, f(64, 1024)], {}),
        "sum_to-bias": ("sum_to", [f(512, 256)], {"shape": (1, 256)}),
    }


def digest(value: Any) -> str:
    h = hashlib.sha256()
    for item in value if isinstance(value, (tuple, list)) else [value]:
        if isinstance(item, torch.Tensor):
            h.update(f"{item.dtype}{tuple(item.shape)}".encode())
            h.update(item.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes()
                     if item.numel() else b"")
        else:
            h.update(repr(item).encode())
    return h.hexdigest()[:16]


def gap(a: Any, b: Any) -> float:
    """The largest difference between two kernels' float outputs, relative to the default's largest magnitude."""
    worst = 0.0
    for x, y in zip(a if isinstance(a, (tuple, list)) else [a], b if isinstance(b, (tuple, list)) else [b]):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            finite = torch.isfinite(y)
            if finite.any():
                scale = max(1.0, float(y.double()[finite].abs().max()))
                diff = (x.double() - y.double())[finite].abs()
                worst = max(worst, float("inf") if diff.isnan().any() else float(diff.max()) / scale)
    return worst


def run_case(op: str, inputs: list[Any], params: dict[str, Any]) -> dict[str, Any]:
    opdef = registry.get(op)
    params = {**{k: v for k, v in opdef.params.items() if v is not registry.REQUIRED}, **params}   # as recorded
    try:
        mode = run_op(opdef, [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs], params, 1, 7,
                      kernel=opdef.reproducible)
    except Exception as exc:  # noqa: BLE001 - reported per case, the caller decides
        return {"error": f"{type(exc).__name__}: {exc}"}
    default = run_op(opdef, [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs], params, 1, 7,
                     kernel=opdef.kernel)
    return {"mode": digest(mode), "default": digest(default), "gap": gap(mode, default),
            "like": kinds(mode) == kinds(default)}


def kinds(value: Any) -> list[Any]:
    """Each output's dtype and shape (a mode kernel must give the op's)."""
    return [(str(v.dtype), tuple(v.shape)) if isinstance(v, torch.Tensor) else type(v).__name__
            for v in (value if isinstance(value, (tuple, list)) else [value])]


def main() -> None:
    inputs_path, threads = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(threads)
    if numerics_mode.current() != numerics_mode.REPRODUCIBLE:
        raise SystemExit(f"run with {numerics_mode.ENV}={numerics_mode.REPRODUCIBLE}")
    stored = np.load(inputs_path, allow_pickle=False)
    results = {}
    for case, op, _, sample in sample_cases():
        inputs = [torch.from_numpy(stored[f"{case}/{k}"].copy()).to(to_tensor(v).dtype)
                  for k, v in enumerate(sample.inputs)]
        results[case] = run_case(op, inputs, dict(sample.params))
    for case, (op, inputs, params) in larger_cases().items():
        results[case] = run_case(op, inputs, params)
    results["_class"] = {"threads": threads, "capability": torch.backends.cpu.get_cpu_capability(),
                         "mkl_cbwr": os.environ.get("MKL_CBWR", ""), "onednn": os.environ.get("ONEDNN_MAX_CPU_ISA", "")}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
