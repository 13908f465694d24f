"""Progress bars for work that may be long (compiling, uploading, fetching): shown on
stderr only once the work has taken more than DELAY seconds, so that quick calls print nothing."""
import sys
import threading
import time
from contextlib import contextmanager

from tqdm.auto import tqdm   # a widget in Jupyter, text on a terminal

DELAY = 1.0      # seconds before a bar appears
REFRESH = 0.25   # how often the watcher looks at the `busy` blocks and redraws their clocks


def bar(total, desc, unit="it", unit_scale=False, disable=False):
    """A tqdm bar that appears after DELAY seconds (on its next update); use it as a context manager."""
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, delay=DELAY, leave=False, file=sys.stderr,
                disable=disable)


class _Busy:
    __slots__ = ("desc", "start", "clock")

    def __init__(self, desc):
        self.desc, self.start, self.clock = desc, time.monotonic(), None


_lock = threading.Lock()
_active = set()   # the `busy` blocks running now
_watcher = None   # one thread shows them all: entering a block costs a set insertion, not a thread start


def _watch():
    while True:
        time.sleep(REFRESH)
        with _lock:
            for block in _active:
                if block.clock is None and time.monotonic() - block.start > DELAY:
                    block.clock = tqdm(desc=block.desc, bar_format="{desc}: {elapsed}", leave=False,
                                       file=sys.stderr)
                    block.clock.start_t -= time.monotonic() - block.start  # count from when the work began
                if block.clock is not None:
                    block.clock.refresh()


@contextmanager
def busy(desc):
    """For one call that cannot report steps (a compile, a single large read): once it has run for DELAY
    seconds, show `desc` and the time taken so far until the block ends."""
    global _watcher
    block = _Busy(desc)
    with _lock:
        _active.add(block)
        if _watcher is None:
            _watcher = threading.Thread(target=_watch, name="ravop-progress", daemon=True)
            _watcher.start()
    try:
        yield
    finally:
        with _lock:
            _active.discard(block)
        if block.clock is not None:
            block.clock.close()
