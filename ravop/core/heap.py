"""Freed heap given back to the operating system. glibc keeps freed blocks under its mmap threshold (which grows to
32 MiB as big blocks are freed) in the heap, so a process stays at its peak for good unless it asks
(`malloc_trim`): a worker after a failed subgraph (worker/execute/memory.py), the requester once a graph it
compiled is uploaded (ravop/client/activation.py)."""
import ctypes
import ctypes.util
from typing import Any, Callable, Optional


def _malloc_trim() -> Optional[Callable[[int], Any]]:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim()


def trim() -> bool:
    """Give the heap's free pages back to the operating system; False where this C library cannot."""
    if _trim is None:
        return False
    _trim(0)
    return True
