"""The C heap, where glibc is the C library. glibc keeps freed blocks under its mmap threshold (which grows to
32 MiB as big blocks are freed) in the heap, so a process stays at its peak for good unless it asks
(`malloc_trim`): a worker after a failed subgraph (worker/execute/memory.py) and after a loop
(worker/loops/heap_hold.py, which also tunes the thresholds with `mallopt`), the requester once a graph it compiled
is uploaded (ravop/client/activation.py)."""
import ctypes
import logging
from typing import Any, Optional

log = logging.getLogger(__name__)


def _glibc() -> Optional[Any]:
    """This process's C library when it is glibc (mallopt, malloc_trim), else None (musl, macOS, Windows)."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not all(hasattr(libc, name) for name in ("gnu_get_libc_version", "mallopt", "malloc_trim")):
        log.debug("not glibc: the heap is left to its allocator")
        return None
    return libc


GLIBC = _glibc()


def trim() -> bool:
    """Give the heap's free pages back to the operating system; False where this C library cannot."""
    if GLIBC is None:
        return False
    GLIBC.malloc_trim(0)
    return True
