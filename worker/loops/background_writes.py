"""Writes a loop makes to the store (its exchange's sends; flushed losses and progress, checkpoints) run in one
thread beside the loop, in the order they were queued: over a slow link each is a round trip or an upload of
the whole carried state, and the loop need not wait for it to go on computing. A write that fails (or finds
the graph stopped) is raised in the loop's thread at its next `check`, `put` or `drain`; the writes queued
after it are dropped, so a checkpoint never lands after a lost write of the steps before it."""
import queue
import threading
from typing import Callable, Optional

# at most this many writes wait behind the one running: a loop that outruns the link waits for it rather than
# holding what it writes without bound (a checkpoint never waits behind another: worker/loops/checkpoint_cadence.py)
QUEUED = 2


class BackgroundWrites:
    """One thread's queue of writes (callables), run in order; `queued`: how many may wait (0: no bound)."""

    def __init__(self, queued: int = QUEUED, name: str = "loop-writes") -> None:
        self.queue: "queue.Queue[Optional[Callable[[], object]]]" = queue.Queue(queued)   # None: stop
        self.name = name
        self.error: Optional[BaseException] = None     # the failure the loop has not been told of yet
        self.failed = False   # once a write failed, none after it runs (even once the loop was told)
        self.thread: Optional[threading.Thread] = None
        self.running = False

    def put(self, write: Callable[[], object]) -> None:
        """Queue `write()` after the writes queued before it (waits while `queued` are waiting already)."""
        self.check()
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, daemon=True, name=self.name)
            self.thread.start()
        self.queue.put(write)

    def busy(self) -> bool:
        """Whether a write is running or queued (a flush of losses can wait for the next step then)."""
        return self.running or not self.queue.empty()

    def _run(self) -> None:
        while True:
            write = self.queue.get()
            self.running = True
            try:
                if write is None:
                    return
                if not self.failed:
                    write()
            except BaseException as exc:   # raised in the loop's thread (check)
                self.error, self.failed = exc, True
            finally:
                self.running = False
                self.queue.task_done()

    def check(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def drain(self) -> None:
        """Return once every queued write is done; raises the first that failed."""
        self.queue.join()
        self.check()

    def close(self) -> None:
        """Finish the queued writes (those after a failed one are dropped) and stop the thread; errors are left
        for `check` (the loop is ending: it raised already, or it drained before its last write)."""
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
            self.thread = None
