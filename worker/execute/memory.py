"""A worker's memory budget, enforced on what kernels actually allocate and produce, not only on what a plan
declares (a plan is data from the network and may lie about its sizes).

- `enforce`: the operating system bounds the process: on a CPU worker RLIMIT_DATA (heap and private
  anonymous mappings, where tensors live) is set to what the process holds now plus the budget, so an
  allocation past it fails in the kernel that asked (torch raises "can't allocate memory") instead of the
  machine swapping or the OOM killer ending the worker. It costs nothing per subgraph. On a GPU worker,
  torch's caching allocator is bounded instead (the CUDA driver's host mappings would count against
  RLIMIT_DATA).
- `allocation_failure`: a kernel whose allocation failed is reported with the sizes involved.
- `oversized`: each value a kernel returns is checked against its declared size and the budget, so an op
  that declares one element and returns a gigabyte fails at that op; a `Watcher` asks it for the runner
  (`ravop.runtime.runner.Runner`), the same for a subgraph's ops and a loop step's.
Each check returns a message naming the sizes; the caller fails the subgraph with it, naming the op and the
user's line (worker/execute/run.py, worker/serve/consumer.py), frees the values and goes on.
- `return_to_os`: after a failed subgraph, the memory its values held is given back to the operating system
  (`ravop.core.heap`: without it a worker stays at its peak for good).
- `default_budget` divides the machine's memory among the workers started on it.
"""
import gc
import logging
import os
import re
import socket
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from ravop.core import heap
from ravop.core.dtypes import NAMES
from ravop.core.node import Node
from ravop.store import worker_info


if TYPE_CHECKING:
    from .validate import Program

log = logging.getLogger("ravop.worker")


def resident_bytes() -> Optional[int]:
    """This process's resident memory (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


MIN_BUDGET = 256 * 2**20  # what the process needs beyond its start to serve at all (buffers, decoding, the cache)


def default_budget(subgraph_limit: int) -> int:
    """The subgraph limit plus half again (kernels' workspaces, the tensor cache and encoding outputs), and never
    less than MIN_BUDGET: a small subgraph limit must not starve the worker itself."""
    return max(subgraph_limit * 3 // 2, MIN_BUDGET)


def return_to_os() -> Optional[tuple[int, Optional[int], Optional[int]]]:
    """Give the heap's free memory back to the operating system; (RSS before, after freeing cycles, after
    malloc_trim) in bytes, or None where this cannot be done or measured."""
    before = resident_bytes()
    if before is None:
        return None
    # A failed kernel's values may be held by a cycle (an exception, its traceback, the frame naming it): the
    # cyclic collector frees them first (cheap: what the worker loaded at start is frozen, worker/serve/worker_cli.py).
    gc.collect()
    collected = resident_bytes()
    if not heap.trim():
        return None
    return before, collected, resident_bytes()


def workers_on_machine(client: Any, name: str) -> int:
    """This worker and the live ones the server lists on this host (by host name): how many share its memory
    when nobody said (`ravop-worker --workers-on-machine`)."""
    here = socket.gethostname()
    return 1 + sum(1 for info in worker_info.read_all(client) if info.get("host") == here and info["name"] != name)


def enforce(device: torch.device, budget: int) -> None:
    """Bound this process's memory to `budget` bytes beyond what it holds now (see the module docstring)."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)
        return
    try:
        import resource
    except ImportError:  # not a POSIX system: the per-output checks still apply
        log.warning("cannot bound this worker's memory on this system (no resource module)")
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = _data_bytes() + budget
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _data_bytes() -> int:
    """VmData of this process: what RLIMIT_DATA counts (0 where /proc is not there)."""
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"VmData:\s+(\d+) kB", f.read())
    except OSError:
        return 0
    return int(found.group(1)) * 1024 if found else 0


def allocation_failure(step: Node, declared: int, exc: Optional[BaseException], budget: int) -> Optional[str]:
    """The message for `exc`, raised by the kernel of `step`, if it says an allocation failed; else None."""
    if not (isinstance(exc, (MemoryError, torch.OutOfMemoryError))
            or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))):
        return None
    found = re.search(r"tried to allocate ([\d.]+ [KMGT]iB|\d+ bytes)", str(exc), re.IGNORECASE)
    if found is None:
        what = "ran out of memory"
    else:  # torch's CPU allocator counts bytes, its CUDA allocator GiB
        amount = found.group(1)
        what = "tried to allocate " + (mib(int(amount.split()[0])) if amount.endswith("bytes") else amount)
    return (f"{what}, over this worker's memory budget of {mib(budget)} (its declared output is "
            f"{tuple(step.shape)} {dtype_name(step)}, {mib(declared)})")


def oversized(step: Node, declared: int, value: Any, budget: int) -> Optional[str]:
    """Why `value`, the output of `step` (a `ravop.core.node.Node` declaring `declared` bytes), is refused: larger than
    the step declared
    (unless a dimension is data-dependent) or than the budget; None if it is not."""
    if not isinstance(value, torch.Tensor):
        return None  # a multi-output op's tuple: the tuple_get steps that read it are checked
    size = value.nbytes
    if size > budget or (size > declared and step.dtype is not None and -1 not in step.shape):
        return (f"produced {tuple(value.shape)} {_dtype_name(value)} ({mib(size)}) but declared "
                f"{tuple(step.shape)} {dtype_name(step)} ({mib(declared)}); this worker's memory budget is "
                f"{mib(budget)}")
    return None


class Watcher:
    """The memory rules of a checked program's ops (`worker.execute.validate.Program`), for
    `ravop.runtime.runner.Runner`: `limits`, per op, its declared output bytes (the common case is one comparison,
    about 0.2 us an op); past that, `problem` says why the output is refused, or None."""
    __slots__ = ("steps", "limits", "budget")
    limits: Sequence[int]

    def __init__(self, program: "Program", budget: Optional[int]) -> None:
        # without a budget (a LoopContext given max_bytes only) the declared sizes alone bound the outputs
        self.steps, self.limits = program.steps, program.limits
        self.budget = budget if budget is not None else sys.maxsize

    def problem(self, index: int, value: Any) -> Optional[str]:
        return oversized(self.steps[index], self.limits[index], value, self.budget)


def dtype_name(step: Node) -> str:
    """The declared dtype of a step by its wire name, for messages."""
    return NAMES.get(step.dtype, "?")


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")
