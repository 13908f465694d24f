"""A replica whose round closed without it drops the rest of that round (DiLoCo's `close_after`; Decoupled
DiLoCo's islands, torchft's quorum that goes on without a failed replica group).

With `close_after` replica 0 waits at most that long at a sync for the others' pseudo-gradients, then closes the
round with those present (worker/loops/exchange.py `_receive_closing`, which marks each value it went without
under `late.{channel}` for that run). A replica that missed the close still ran its whole round, sent what no one
would read, and started the next round as late as it was: replica 0 waited for it again, up to `close_after`, at
every following round, until the lag was gone, so the survivors lost about as much time as if the rounds had
waited for it, and its work of several rounds was dropped. A replica resumed after its provider was lost is such a
replica: it is behind by the detection, the new provider's start and the steps since its checkpoint.

So a replica r > 0 watches, beside its loop, whether the round it is in closed without it (the mark on the
first value its `up` template sends, for the run that template has next), and once it did, stops the round after
the step it is at and goes on at its `down` template: it receives the outer step's update and restarts from the
new global model with the others. What that costs: the steps of the round it drops (their losses stay NaN, their
samples untrained for that round), its inner optimizer state keeps their updates; the bits then depend on the
machines' timing, as any round closed without a replica does. A round that went without no one drops nothing:
the same bits as without `close_after`. Replica 0 closes the rounds and never drops one (its sync receives)."""
import bisect
import threading
from typing import Any, Callable, Optional, Sequence

from ravop.core.loop_template import StepTemplate
from ravop.store.client_types import Client

POLL_SECONDS = 0.5   # how often the mark is looked for: a round trip each, beside the loop


def mark(channel: str) -> str:
    """The exchange channel under which a run that went without `channel`'s value marks it."""
    return f"late.{channel}"


def droppable(templates: Sequence[StepTemplate], syncs: Sequence[int], close_after_s: float) -> Optional[str]:
    """The channel whose mark says a round closed without this loop, or None for a loop that never drops one:
    rounds that close with the replicas present (`close_after_s` > 0), the first sync template only sending (the
    replica's contribution), the last receiving (the round's update) and reading no carried value the first one
    changed (with `overlap_start='local'` `down` subtracts what `up` sent, kept in a carried slot: skipping `up`
    would leave the round's start there)."""
    if not close_after_s > 0 or len(syncs) < 2:
        return None
    first, last = templates[syncs[0]], templates[syncs[-1]]
    if first.received or not first.sent or not last.received:
        return None
    changed = {slot.hole for slot in first.carried if slot.hole != slot.after}
    slots = {a.hole: b.hole for a, b in zip(first.carried, last.carried)}   # slot k's hole in `up` -> in `down`
    read = {i for node in last.nodes for i in node.inputs}
    if any(slots[hole] in read for hole in changed):
        return None
    return first.sent[0].channel


class LateRounds:
    """`skip_to(done)` after each step: where to go on when the round it is in closed without it."""

    def __init__(self, client: Client, key: Callable[[int], str],
                 rounds: list[tuple[int, int, int]], poll: float = POLL_SECONDS) -> None:
        """`key(run)`: the mark's key for a round whose `up` has run index `run`; `rounds`: (steps done before
        its `up`, that run index, steps done before its `down`) of each round, in order."""
        self.client, self.key, self.rounds, self.poll = client, key, rounds, poll
        self.ups = [up for up, _, _ in rounds]
        self.watching: Optional[int] = None   # the run whose mark the thread looks for
        self.closed: set[int] = set()
        self.error: Optional[BaseException] = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="late-rounds")
        self.thread.start()

    @classmethod
    def of(cls, client: Client, key: Callable[[int], str], positions: Any, first_sync: int, last_sync: int,
           first_step: int, poll: float = POLL_SECONDS) -> "LateRounds":
        """From a loop's positions (`LoopSpec.positions()`: template and run index per step)."""
        rounds, up = [], None
        for index, (t, _, _, _, run) in enumerate(positions):
            if t == first_sync:
                up = (index - first_step, run)
            elif t == last_sync and up is not None:
                rounds.append((*up, index - first_step))
                up = None
        return cls(client, key, rounds, poll)

    def skip_to(self, done: int) -> Optional[int]:
        """After `done` steps: the steps done before the `down` to go on at if the round whose `up` is ahead
        closed without this loop, else None (and the thread looks for that round's mark)."""
        if self.error is not None:
            raise self.error
        k = bisect.bisect_left(self.ups, done)
        if k == len(self.rounds):
            self.watching = None
            return None
        _, run, down = self.rounds[k]
        self.watching = run
        return down if run in self.closed else None

    def _run(self) -> None:
        try:
            while not self.stopped.wait(self.poll):
                run = self.watching
                if run is not None and run not in self.closed and self.client.exists(self.key(run)):
                    self.closed.add(run)
        except Exception as exc:   # raised in the loop's thread at its next step
            self.error = exc

    def stop(self) -> None:
        self.stopped.set()


class RoundClosed(Exception):
    """Raised after a step: the round closed without this loop; go on from `start` steps with `carried`."""

    def __init__(self, start: int, carried: list[Any]) -> None:
        super().__init__(f"the round closed without this loop: going on after step {start}")
        self.start, self.carried = start, carried
