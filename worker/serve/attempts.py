"""Attempts that count failures, not progress (`ravop-worker --max-attempts`).

A subgraph taken over from a dead worker is redelivered (worker/serve/takeover.py). A plain subgraph starts
afresh each time, so each redelivery is a failed attempt. A training loop resumes from its checkpoint: if the
worker that died checkpointed past the step its own attempt resumed from, it made progress, and losing it was
churn (a provider that left), not the subgraph's fault. So a redelivery counts as a failure only when the
checkpoint it resumes from is no newer than the one the previous attempt resumed from; progress sets the count
back to 0. A poison subgraph (one that kills every worker that takes it, at the same step) makes no progress
between deaths and is dead-lettered after `max_attempts` failures; one that dies a little later each time is
bounded too, since progress is bounded by the loop's steps.

What the last redelivery found is kept per subgraph in the graph's `attempts` hash as
"message id, deliveries, step resumed from, failures": only the worker that won the message's XCLAIM writes it,
and a worker resuming its own message after an outage (the same delivery) finds its own record and counts nothing.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Union

NO_CHECKPOINT = -1   # the step "resumed from" by an attempt that starts from the loop's beginning


@dataclass(frozen=True)
class Attempt:
    failures: int          # redeliveries in a row that found no progress since the attempt before
    resumed_from: int      # the checkpoint step this delivery resumes from (NO_CHECKPOINT: none)
    steps_done: Optional[int]   # the loop's last recorded progress (steps), None for a plain subgraph
    checkpoint: Dict[bytes, bytes] = field(default_factory=dict)   # the loop's checkpoint record as read ({}: none)

    def where(self) -> str:
        """Where the failing attempts stopped, for the dead letter ('' for a plain subgraph)."""
        if self.steps_done is None and self.resumed_from == NO_CHECKPOINT:
            return ""
        start = "its start" if self.resumed_from == NO_CHECKPOINT else f"its checkpoint at step {self.resumed_from}"
        done = "" if self.steps_done is None else f"; the last progress recorded was step {self.steps_done}"
        return f" each resumed from {start} and died before the next checkpoint{done}"


def _record(message_id: Union[bytes, str], deliveries: int, resumed_from: int, failures: int) -> str:
    message = message_id.decode() if isinstance(message_id, bytes) else message_id
    return f"{message} {deliveries} {resumed_from} {failures}"


def count(client: Any, keys: Any, subgraph_id: int, message_id: Union[bytes, str], deliveries: int) -> Attempt:
    """The Attempt of a redelivered message (`deliveries` > 1), recorded for the next redelivery: one round trip
    to read what the previous one found with the loop's checkpoint record and progress, one to write it."""
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.attempts, subgraph_id)
    pipe.hgetall(keys.checkpoint(subgraph_id))   # whole: the loop reads the tensors it names with its inputs
    pipe.hget(keys.steps, subgraph_id)
    record, checkpoint, steps = pipe.execute()
    saved = checkpoint.get(b"step")
    resumed_from = NO_CHECKPOINT if saved is None else int(saved)
    steps_done = None if steps is None else int(steps)
    # no record: the redeliveries before this one went unrecorded (claimed by hand, or by an older worker) and
    # count as failures; the first delivery started from the loop's beginning
    last_from, failures = NO_CHECKPOINT, deliveries - 2
    if record is not None:
        message, seen, last_from_text, failures_text = record.decode().split(" ")
        if _record(message_id, deliveries, 0, 0).split(" ")[:2] == [message, seen]:
            return Attempt(int(failures_text), int(last_from_text), steps_done, checkpoint)   # the same delivery
        last_from, failures = int(last_from_text), int(failures_text)
    failures = 0 if resumed_from > last_from else failures + 1
    client.hset(keys.attempts, subgraph_id, _record(message_id, deliveries, resumed_from, failures))
    return Attempt(failures, resumed_from, steps_done, checkpoint)
