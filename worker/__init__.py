"""ravop-worker: takes subgraphs from Redis streams, runs them with torch kernels, stores the outputs."""
from .consumer import Worker

__all__ = ["Worker"]
