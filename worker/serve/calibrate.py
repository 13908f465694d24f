"""The cost model's figures for this worker, measured at start (about 0.1 s; the device's own are kept per machine:
worker/execute/calibration_cache.py), advertised with its capabilities (`ravop.store.worker_info`) and read by the
compiler (`compiler.cost.calibrated`) instead of the round numbers of one machine: per-op dispatch, matmul FLOP/s,
elementwise memory bytes/s, and the bytes/s of handing a tensor to another worker through Redis (the store's own
write and read)."""
import time
from typing import Any, Callable, Optional

import torch

from ravop.core import registry
from ravop.core.cost_fields import COST_FIELDS
from ravop.runtime.evaluate import run_op
from ravop.store import tensors as stored
from ravop.store.client_types import Client
from ravop.store.keys import calibration_key

from ..execute import calibration_cache


def _best_seconds(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """The fastest of `repeats` calls (the least disturbed by other processes), after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def _handoff_seconds(client: Client, name: str, tensor: torch.Tensor, chunk: int) -> float:
    """One store and fetch of `tensor` by the store's own code (in chunks where the server caps one value)."""
    # A key of the tensor pattern that a worker's ACL user may write and delete; no graph has this id.
    key = calibration_key(name)
    try:
        start = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        stored.write(pipe, key, tensor, chunk)
        pipe.execute()
        stored.read(client, key)
        return time.perf_counter() - start
    finally:
        client.delete(*stored.keys_of(key))


def measure(device: torch.device, client: Client, name: str, cache_path: Optional[str] = None) -> dict[str, float]:
    """{field: value} of `COST_FIELDS` for `device`, one significant digit each: the partitioner needs the order of
    magnitude, and the same worker should not advertise a different plan-changing figure at every start. The
    device's own figures come from `cache_path` (default: `calibration_cache.default_path()`; "": none) where it
    has them for this machine; the hand-off's, which depend on the server, are measured every time (a few ms)."""
    cache_path = calibration_cache.default_path() if cache_path is None else cache_path
    key = calibration_cache.machine_key(device)
    machine = calibration_cache.load(cache_path, key, COST_FIELDS[:3])
    if machine is None:
        machine = _measure_device(device)
        calibration_cache.store(cache_path, key, machine)
    payload, chunk = torch.ones(2**16), stored.fit_to_server(client)  # 256 KiB: room on any server that runs graphs
    handoff_bytes_per_s = payload.nbytes / min(_handoff_seconds(client, name, payload, chunk) for _ in range(3))
    return {**machine, COST_FIELDS[3]: _rounded(handoff_bytes_per_s)}


def _rounded(value: float) -> float:
    return float(f"{value:.0e}")


def _measure_device(device: torch.device) -> dict[str, float]:
    """{op_s, flops_per_s, bytes_per_s} of `device`, timed now."""
    small = torch.ones(4, device=device)
    side = 512 if device.type == "cpu" else 2048
    a = torch.ones(side, side, device=device)
    big = torch.ones(2**22, device=device)   # 48 MiB read and written: more than a CPU's caches hold
    add, calls = registry.get("add"), 100
    one_add = _best_seconds(lambda: [run_op(add, [small, small], {}, device=device) for _ in range(calls)],
                            device, 3) / calls
    op_s = one_add / 4   # the model's fixed part plus 3 tensors' part, each taken equal (compiler/cost.py)
    flops_per_s = 2 * side**3 / _best_seconds(lambda: torch.mm(a, a), device, 3)
    bytes_per_s = 3 * big.nbytes / _best_seconds(lambda: torch.add(big, big), device, 3)
    return {field: _rounded(value) for field, value in zip(COST_FIELDS, (op_s, flops_per_s, bytes_per_s))}
