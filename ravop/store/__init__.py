"""The Redis schema both sides share: key names (`keys`), the Lua scripts that move a graph along
(`scripts`), connecting (`connect`), worker liveness (`workers`) and the requester's graph operations
(`graphs`). Tensors are stored with `ravop.wire.codec`; nothing is pickled."""
from .connect import connect, ensure_queues
from .keys import (DEAD_LETTER, DEVICE_KINDS, GROUP, GraphKeys, TokenKeys, check_name, device_kind, queue,
                   token_namespace)
from .scripts import Scripts

__all__ = ["connect", "ensure_queues", "DEAD_LETTER", "DEVICE_KINDS", "GROUP", "GraphKeys", "TokenKeys",
           "check_name", "device_kind", "queue", "Scripts", "token_namespace"]
