"""The FLOPs of the aten ops run inside a `with FlopCount() as count:` block, by torch's own per-op formulas
(`torch.utils.flop_counter.flop_registry`: matmuls, convolutions, attention), for the cost model.

torch's `FlopCounterMode` counts the same ops by the same formulas, but every `TorchDispatchMode` subclass has its
`__torch_dispatch__` wrapped to disable Dynamo, and the first call of that wrapper imports torch._dynamo: 3.4 s and
71 MiB at load in a requester that recorded a TorchScript model, for a probe that never compiles. This mode opts out
of that wrapping (`_should_skip_dynamo`, torch's documented switch for it) and keeps only the total: no per-module
tree, no higher-order ops (TorchScript code runs none)."""
from typing import Any, Optional

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


class FlopCount(TorchDispatchMode):
    """A dispatch mode summing the FLOPs of the ops it sees into `total`."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False    # nothing runs compiled under a probe: no need to import Dynamo to disable it

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out
