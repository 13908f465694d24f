"""While a loop's steps run, the C heap keeps the memory a step frees for the next step, instead of giving it back
to the kernel and faulting it in again; it is given back when the steps end.

glibc's dynamic thresholds let a step's large tensors (resnet18's 9.4 MB convolution weights' gradients) come
from the heap, and trim its top once twice that much is free: on every step. Measured on a warm worker training
resnet18 (batch 16, one thread, 2026-11-29): 12 brk calls and ~9,000 minor page faults a step, 0.019 s of system
time against eager PyTorch's 0.010 in its own process (user time equal, 0.052 s), so a step cost 1.3x eager's
CPU; held, 0.003 s and ~1,800 faults (docs/reports/benchmarks.md, "Where a warm worker's step time went"). The
memory held is the step's own working set, which each step reaches again: the peak is the same.

Only with glibc (its `mallopt` and `malloc_trim`); elsewhere the heap is left to its allocator's own rules."""
import contextlib
from typing import Iterator

from ravop.core import heap

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20      # blocks above it are mapped on their own: glibc's ceiling for its dynamic threshold
HOLD = 2**31 - 1               # no trim while the steps run (mallopt takes an int)
AFTER = 2 * MMAP_THRESHOLD     # after them: glibc's own trim threshold at that ceiling


@contextlib.contextmanager
def held() -> Iterator[None]:
    """The heap neither trimmed nor its thresholds moved while inside; trimmed on the way out."""
    libc = heap.GLIBC
    if libc is None:
        yield
        return
    # setting either threshold fixes both (glibc stops adjusting them): the mapped size is set too, or it would
    # stay wherever the dynamic rule had left it (128 KiB in a fresh process: every tensor mapped anew)
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    libc.mallopt(M_TRIM_THRESHOLD, HOLD)
    try:
        yield
    finally:
        libc.mallopt(M_TRIM_THRESHOLD, AFTER)
        heap.trim()
