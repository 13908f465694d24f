"""The one host copy of a loop's carried state that a checkpoint in flight is written from. The loop updates its
tensors in place, so a checkpoint written beside it needs a copy; made once and refilled for each checkpoint
(worker/loops/checkpoint_cadence.py takes none while the last is being written), it costs the loop a memcpy,
where a fresh copy per checkpoint also page-faulted its memory in and, queued behind a slow write, held up to
three copies (issue 46)."""
from typing import Any, List, Sequence

import torch


class CheckpointBuffer:
    """Host tensors shaped as the carried values, refilled by `fill`."""

    def __init__(self) -> None:
        self.held: List[torch.Tensor] = []

    def fill(self, carried: Sequence[Any]) -> List[torch.Tensor]:
        """Host copies of `carried` in the buffer's tensors (made anew only if a shape or dtype changed)."""
        if [(t.shape, t.dtype) for t in self.held] != [(v.shape, v.dtype) for v in carried]:
            # pinned host memory for a device's values: their copy is a DMA, not a staged one
            self.held = [torch.empty(v.shape, dtype=v.dtype, pin_memory=v.is_cuda) for v in carried]
        for slot, value in zip(self.held, carried):
            slot.copy_(value)
        return list(self.held)
