"""Data helpers for training loops. The original's module layout is kept: scripts import
`from ravdl.v2.utils.data_manipulation import batch_iterator` or `from ravdl.v2.utils import batch_iterator`."""
from .data_manipulation import batch_iterator

__all__ = ["batch_iterator"]
