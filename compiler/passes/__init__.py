"""Graph passes: each a plain function `ir -> (ir, count of changes)` with one job."""
from .cse import eliminate_common_subexpressions
from .dce import eliminate_dead_code
from .fold import fold_constants
from .fuse import fuse_linear_chains
from .loops import fold_repeated_steps

__all__ = ["eliminate_dead_code", "eliminate_common_subexpressions", "fold_constants", "fuse_linear_chains",
           "fold_repeated_steps"]
