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

Where the server takes a checkpoint about as fast as the host copies it (one on this host: `in_loop`, decided
from the rate the worker measured for its store at start and checked on every write), the checkpoint is instead
written from the loop's own tensors in its thread: the loop waits for the write (a stall bounded as a copy's
is, by STALL_SPACING), and the worker holds no second copy of the state (12 bytes a parameter with Adam: issue
46). The first write slower than IN_LOOP_BYTES_PER_S (and longer than IN_LOOP_SECONDS) sends the later ones
beside the loop again.

On a CPU worker, a loop that exchanges nothing and is not spot-checked (`fenced`) takes neither stall: the
checkpoint is written beside the loop while the next step's forward and backward run, and only that step's
optimizer updates, which overwrite the carried values in place, wait for what reads them (a fence:
ravop/runtime/loop_run.py `LoopRun.fence`). It reads the loop's own tensors where its write should end within two
steps (`from_live`: no copy held), else the host buffer, filled beside the loop (the fence waits for the fill only).
The loop's wait at the fence is the stall that STALL_SPACING bounds; one over a step sends the later checkpoints
through the buffer.

Within those bounds an adaptive cadence (no --checkpoint-seconds) checkpoints every SPACING times what the last
one cost (copy and write), at least `least` and at most `seconds` apart: the steps a killed provider loses
are half the interval on average, so short intervals for cheap checkpoints (docs/reports/benchmarks.md). The
first is spaced the same way by what it is expected to cost (`expect`: the state's bytes at the store's rate the
worker measured at start), not `least` after the loop starts: a checkpoint also holds 12 bytes a parameter
(Adam's) in the server, and a 20-step GPT of 15.4M parameters took one 0.5 s into its 9 s loop, 185 MB stored
to save at most 0.5 s of its work (issue 46)."""
from dataclasses import dataclass
from typing import Optional

SPACING = 50        # an adaptive cadence: every 50x a checkpoint's copy and write, 2% of the loop's time
STALL_SPACING = 25  # any cadence: copies (or writes in the loop's thread) at most 4% of the loop's time
# A store this fast takes a checkpoint in the loop's thread: the embedded server's unix socket measures 4e8 at a
# worker's start (a 256 KiB hand-off) and takes a 134 MB checkpoint in ~0.1 s; a LAN's 1 Gbit/s is at the bound,
# the WAN lab's links and tests/throttled_link.py far below it.
IN_LOOP_BYTES_PER_S = 1e8
IN_LOOP_SECONDS = 0.05   # a write this short stays in the loop's thread at any rate (a small state's is a round trip)


@dataclass
class CheckpointCadence:
    """`due` on every step; `taken` once a checkpoint's copy is made, `written` once it is in the store."""
    seconds: float        # the longest interval (an adaptive cadence's), or the interval asked for
    adaptive: bool
    least: float = 0.5    # an adaptive cadence's shortest interval
    every: float = 0.0    # the interval now
    copy_seconds: float = 0.0
    copied: float = 0.0     # the seconds the loop spent in copies (or writes in its thread), all told (the
    #                         checkpoint record shows them)
    writing: bool = False   # a checkpoint taken and not written yet
    in_loop: bool = False   # the next checkpoint is written in the loop's thread from its own tensors
    fenced: bool = False    # the checkpoint in flight is read beside the loop up to a fence (its wait: `waited`)
    rate: float = 0.0       # the store's bytes/s: measured by the worker at start, then by each write
    live: bool = True       # a fenced checkpoint may be read from the loop's own tensors (`from_live`)
    fence_wait: float = 0.0  # what the fence of the checkpoint in flight cost the loop

    def __post_init__(self) -> None:
        self.every = self.least if self.adaptive else self.seconds

    def expect(self, nbytes: int, bytes_per_s: float) -> None:
        """Before the first checkpoint: an adaptive cadence's first interval from what writing `nbytes` should
        cost at `bytes_per_s` (unknown, 0: `least`)."""
        self.rate = bytes_per_s
        if self.adaptive and bytes_per_s > 0:
            self.every = min(self.seconds, max(self.least, SPACING * nbytes / bytes_per_s))

    def from_live(self, nbytes: int, step_seconds: float) -> bool:
        """Whether a fenced checkpoint of `nbytes` reads the loop's own tensors: where writing it at the store's
        rate should end within two steps of `step_seconds` (the next step's optimizer updates wait for it: a wait
        of up to a step, once per checkpoint, rather than a second copy of the state held), and no fence has
        waited longer than that yet."""
        return self.live and self.rate > 0 and nbytes / self.rate <= 2 * step_seconds + IN_LOOP_SECONDS

    def waited(self, seconds: float, step_seconds: float = 0.0) -> None:
        """The loop waited `seconds` at a fence for a checkpoint to read its values: its stall (the steps take
        `step_seconds`)."""
        self.copied += seconds
        self.fence_wait = seconds
        if seconds > step_seconds + IN_LOOP_SECONDS:
            self.live = False
        self.every = max(self.every, STALL_SPACING * seconds)   # whether the write has ended or not

    def due(self, asked: bool, since: Optional[float], now: float) -> bool:
        """Whether to take a checkpoint at `now`: `asked` (its steps, or its synchronisation, came) or, with `since`
        (when the last was taken), the interval passed; never while the last is being written."""
        return not self.writing and (asked or (since is not None and now - since >= self.every))

    def taken(self, copy_seconds: float, fenced: bool = False) -> None:
        self.writing, self.copy_seconds, self.fenced, self.fence_wait = True, copy_seconds, fenced, 0.0
        self.copied += copy_seconds

    def written(self, write_seconds: float, nbytes: int = 0) -> None:
        """The checkpoint taken last, of `nbytes`, is in the store after `write_seconds` (beside the loop, or in its
        thread where `in_loop`: then the write was the loop's stall)."""
        self.writing = False
        if nbytes and write_seconds > 0:
            self.rate = nbytes / write_seconds
        stall = self.fence_wait if self.fenced else self.copy_seconds
        if self.in_loop and not self.fenced:
            stall += write_seconds
            self.copied += write_seconds
            self.in_loop = write_seconds <= max(IN_LOOP_SECONDS, nbytes / IN_LOOP_BYTES_PER_S)
        every = self.seconds
        if self.adaptive:
            every = min(self.seconds, max(self.least, SPACING * (self.copy_seconds + write_seconds)))
        self.every = max(every, STALL_SPACING * stall)
