"""When a loop's next periodic checkpoint is due, from what checkpoints cost (a loop that exchanges values takes
them at the synchronisations its graph agreed on: worker/loops/sync_cadence.py; this rule still holds it while
its last checkpoint is being written). A checkpoint costs two things:

- the loop's time: its carried state is copied to the host on the loop's thread (later steps update it in
  place), a stall that grows with the model (~0.3 s for 1.2 GB). Checkpoints are spaced at least
  STALL_SPACING copies apart, so the copies take at most 1 / STALL_SPACING of the loop's time, however long
  `seconds` asks for;
- the link's time: the write goes up beside the loop, and no checkpoint is taken while the last is still being
  written: one checkpoint is in flight at a time, held in one host copy (worker/loops/checkpoint_buffer.py), and
  one that comes due meanwhile waits for it and then takes the state of its own step (the latest state wins).
  A queue of copies behind a slow write held up to three copies of a 100M-parameter model's state and stalled
  the loop 35-40% of its time (issue 46).

Within those bounds an adaptive cadence (no --checkpoint-seconds) checkpoints every SPACING times what the last
one cost (copy and write), at least `least` and at most `seconds` apart: the steps a killed provider loses
are half the interval on average, so short intervals for cheap checkpoints (docs/reports/benchmarks.md)."""
from dataclasses import dataclass
from typing import Optional

SPACING = 50        # an adaptive cadence: every 50x a checkpoint's copy and write, 2% of the loop's time
STALL_SPACING = 25  # any cadence: copies at most 4% of the loop's time


@dataclass
class CheckpointCadence:
    """`due` on every step; `taken` once a checkpoint's copy is made, `written` once it is in the store."""
    seconds: float        # the longest interval (an adaptive cadence's), or the interval asked for
    adaptive: bool
    least: float = 0.5    # an adaptive cadence's shortest interval
    every: float = 0.0    # the interval now
    copy_seconds: float = 0.0
    copied: float = 0.0     # the seconds the loop spent in copies, all told (the checkpoint record shows them)
    writing: bool = False   # a checkpoint taken and not written yet

    def __post_init__(self) -> None:
        self.every = self.least if self.adaptive else self.seconds

    def due(self, asked: bool, since: Optional[float], now: float) -> bool:
        """Whether to take a checkpoint at `now`: `asked` (its steps, or its synchronisation, came) or, with `since`
        (when the last was taken), the interval passed; never while the last is being written."""
        return not self.writing and (asked or (since is not None and now - since >= self.every))

    def taken(self, copy_seconds: float) -> None:
        self.writing, self.copy_seconds = True, copy_seconds
        self.copied += copy_seconds

    def written(self, write_seconds: float) -> None:
        """The checkpoint taken last is in the store after `write_seconds` beside the loop."""
        self.writing = False
        every = self.seconds
        if self.adaptive:
            every = min(self.seconds, max(self.least, SPACING * (self.copy_seconds + write_seconds)))
        self.every = max(every, STALL_SPACING * self.copy_seconds)
