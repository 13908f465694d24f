"""Op definitions, one module per family; importing this package fills the registry."""
from . import core, arithmetic  # noqa: F401
