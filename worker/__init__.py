"""ravop-worker: takes subgraphs from the Redis stream of its device kind, runs them with the registry's
torch kernels, and stores their outputs. `python -m worker --help`."""
from .consumer import Worker

__all__ = ["Worker"]
