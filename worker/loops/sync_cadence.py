"""When a loop that exchanges values (a resident replica) takes its periodic checkpoint. The checkpoint is the
replica's whole carried state (parameters, optimizer moments, error-feedback residuals, the global model), many
times what a round exchanges, so it is taken right after a synchronisation, every `seconds` or so, and the
loops of a graph take it at the same synchronisations, so that the global model they all carry there is stored
once (worker/loops/shared_checkpoint.py). Hence the cadence is agreed in rounds, once per graph:

- the first loop whose clock says `seconds` have passed proposes the rounds it ran in them, plus a lead of an
  eighth (at least 2 rounds), so that the first common checkpoint is still ahead of the others, which started
  within moments of it; but at least as many rounds as keep its checkpoint within `BYTES_SHARE` of the bytes it
  sends in those rounds (a checkpoint goes up the same link: on slow rounds a 60 s cadence would send more
  checkpoint than pseudo-gradient);
- it is written with SET NX to the graph's `ckpt:rounds`; every loop reads the agreed number there when its own
  clock comes due (the first proposal stands);
- a loop checkpoints at synchronisation k (counted from the fit's start) when k // rounds has passed its last
  checkpoint's: on the common synchronisations, and a loop that read the number late, or resumed from a
  checkpoint elsewhere, falls in with them from the next one.

A loaded host or a slow link then changes the seconds between two checkpoints, not the rounds: their share of
the bytes a round moves stays what it was when agreed. `seconds` 0 checkpoints at every synchronisation."""
import math
from typing import Any, Optional

from ravop.core.errors import PlanError
from ravop.store.client_types import Client
from ravop.store.keys import GraphKeys

from .checkpoint_cadence import CheckpointCadence

BYTES_SHARE = 0.25   # a checkpoint's state at most this share of what the rounds between two checkpoints send
LEAD = 8             # the first common checkpoint comes rounds / LEAD rounds (at least 2) after the proposal
# Long rounds (much compute, compressed exchanges: a round of 29 s sending a small share of the state) made the
# bytes' floor 126 rounds, and replicas killed once a minute never checkpointed (WAN lab, docs/reports/wan_lab.md,
# 2026-11-29): a checkpoint that small against a round that long costs little link time whatever the share.
MAX_GAP_SECONDS = 30.0


def rounds_key(keys: GraphKeys) -> str:
    return keys.checkpoint("rounds")


def agree(client: Client, keys: GraphKeys, proposal: int) -> int:
    """The graph's rounds between checkpoints: `proposal` if no loop proposed before, else the first proposal."""
    pipe = client.pipeline(transaction=True)
    pipe.set(rounds_key(keys), proposal, nx=True)
    pipe.get(rounds_key(keys))
    return _rounds(keys, pipe.execute()[-1])


def agreed(client: Client, keys: GraphKeys) -> Optional[int]:
    """The graph's rounds between checkpoints if a loop proposed them (a loop resumed elsewhere), else None."""
    value = client.get(rounds_key(keys))
    return None if value is None else _rounds(keys, value)


def _rounds(keys: GraphKeys, value: Any) -> int:
    try:
        rounds = int(value)
    except (TypeError, ValueError):
        rounds = 0
    if rounds < 1:
        raise PlanError(f"the graph's agreed rounds between loop checkpoints ({rounds_key(keys)}) is {value!r}, "
                        f"not a positive number")
    return rounds


def proposal(ran: int, state_bytes: int, sent_bytes: int, elapsed: float = 0.0) -> int:
    """Rounds between checkpoints for a loop that ran `ran` rounds in `elapsed` seconds (the cadence's seconds or
    more), carries `state_bytes` and sent `sent_bytes` to the other loops in those rounds."""
    floor = math.ceil(state_bytes / (BYTES_SHARE * sent_bytes / ran)) if sent_bytes and ran else 1
    rounds = max(ran, floor, 1)
    if elapsed > 0:   # the bytes' floor never spaces checkpoints more than MAX_GAP_SECONDS of rounds apart
        rounds = min(rounds, max(ran, 1, math.floor(MAX_GAP_SECONDS * ran / elapsed)))
    # every synchronisation is a common one: a lead would only space them further
    return rounds if rounds == 1 else rounds + max(2, math.ceil(rounds / LEAD))


def within_round_due(timing: CheckpointCadence, now: float, round_began: float, last: float) -> bool:
    """Whether a loop checkpoints within a round, after an inner step: when the round has lasted and the last
    checkpoint is older than the loop's checkpoint interval (`timing.every`, the ordinary loops' cadence: by the
    checkpoints' cost, at most `--checkpoint-seconds`), and none is in flight (so at most one is on the link).
    Rounds longer than the interval (much compute between exchanges: a WAN-lab round of 512 steps lasted 42 s)
    otherwise put a round or more of compute behind every checkpoint, all of it redone by a replica whose provider
    is lost while the other replicas wait for it at the barrier; shorter rounds keep to the agreed
    synchronisations (the bytes' rule above). Not 50x the last checkpoint's cost whatever the interval: over a
    50 ms link a checkpoint's round trips (0.5-0.6 s) spaced them 25-30 s apart."""
    interval = timing.every
    return not timing.writing and now - round_began >= interval and now - last >= interval


class SyncCadence:
    """One loop's side of the agreement: `at_sync` at each synchronisation's end says whether to checkpoint
    there and, once its clock is due with no agreed number known, which number to propose (`agree` answers,
    then `agreed`); `taken` after each checkpoint, whatever made it."""

    def __init__(self, seconds: float, now: float) -> None:
        self.seconds, self.since = seconds, now
        # agreed rounds between checkpoints (None: not known yet)
        self.rounds: Optional[int] = 1 if seconds == 0 else None
        self.first: Optional[int] = None      # the synchronisation before the first one this loop ran here
        self.last: Optional[int] = None       # the synchronisation of its last checkpoint here
        self.proposed = False

    def at_sync(self, k: int, now: float, state_bytes: int, sent_bytes: int) -> tuple[bool, Optional[int]]:
        """(checkpoint after synchronisation k?, rounds to propose or None)."""
        if self.first is None:
            self.first = k - 1
        if self.rounds is not None:
            last = self.last if self.last is not None else k - 1
            return k // self.rounds > last // self.rounds, None
        if self.proposed or now - self.since < self.seconds:
            return False, None
        self.proposed = True
        return False, proposal(k - self.first, state_bytes, sent_bytes, now - self.since)

    def agreed(self, rounds: Optional[int]) -> None:
        if rounds is not None and self.rounds is None:
            self.rounds = rounds

    def taken(self, k: Optional[int], now: float) -> None:
        if k is not None:
            self.last = k
        self.since = now
