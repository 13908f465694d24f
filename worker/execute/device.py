"""Where a worker's tensors live: one host<->device move per subgraph, and how much memory a subgraph may
declare."""
import os
from typing import Any

import torch

from ravop.store import device_kind


def parse(name: str) -> torch.device:
    """torch.device of 'cpu', 'cuda' or 'cuda:N', checked against this machine."""
    device_kind(name)
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device} requested but torch sees no CUDA GPU on this machine")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.index >= torch.cuda.device_count():
            raise ValueError(f"device {device} requested but this machine has {torch.cuda.device_count()} GPU(s)")
    return device


def use_full_precision(device: torch.device) -> None:
    """On a GPU, float32 math as a CPU worker does it: cuDNN convolutions otherwise use TF32 (10-bit
    mantissas), ~1e-3 relative off a CPU worker's results; and one convolution algorithm per shape, so that a
    retried subgraph gives the same bits. Applies to the whole process (a worker serves one device)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def default_limit(device: torch.device, workers_on_machine: int = 1) -> int:
    """Half the device's memory: a subgraph declaring more fails clearly instead of being OOM-killed. On a CPU,
    half of this worker's share of the machine's memory: the workers on one machine share it."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 2
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not a POSIX system
        total = 16 * 2**30
    return total // max(1, workers_on_machine) // 2


def budget(device: torch.device, limit: int) -> int:
    """Bytes a subgraph may declare now: the configured limit, and on a GPU no more than is free (counting
    what torch's caching allocator holds but does not use)."""
    if device.type != "cuda":
        return limit
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return min(limit, free + cached)


def to_device(tensor: Any, device: torch.device) -> Any:
    return tensor if tensor.device == device else tensor.to(device)


def to_host(tensor: Any) -> Any:
    return tensor if tensor.device.type == "cpu" else tensor.cpu()


def release_cached(device: torch.device) -> None:
    """Give the blocks torch's CUDA allocator keeps for reuse back to the device (after running out of
    memory, so that the next subgraph starts from what is really in use)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
