"""ravop-worker: takes subgraphs from the Redis stream of its device kind, runs them with the registry's
torch kernels, and stores their outputs. `python -m worker --help`."""
import os

from ravop.core.cpu_threads import passive_waiting

# Before torch loads OpenMP, which reads it once: a worker's idle threads sleep instead of spinning on cores
# that others share (ravop.core.cpu_threads). The embedded default sets it too; this covers `ravop-worker`.
passive_waiting(os.environ)

from .serve.consumer import Worker  # noqa: E402

__all__ = ["Worker"]
