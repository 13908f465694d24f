"""When a loop waiting for another loop's values gives its worker up (worker/loop_subgraph.py: `on_wait`).

A resident replica waiting at a synchronisation does no work, so its worker could run a loop that waits for a
worker: with fewer workers than replicas the replicas must take turns, or the graph deadlocks. But giving a
replica up costs it its place: whoever runs it next reads its data shard and checkpoint again (megabytes over a
slow link), and its worker's cached shard and values are wasted. Asking only "is work queued?" made every
replica waiting at a synchronisation hand its loop back when one provider died (its message became claimable),
and each then took whichever loop was queued: one kill moved every replica.

So the rule is work-conserving and yields one worker at a time, as a scheduler that keeps tasks on their node
until the cluster has no free slot (Spark's delay scheduling, Borg's preemption as a last resort):

- a waiting loop hands itself back only if a loop waits for a worker (a message no worker has read, or one a dead
  worker held);
- never while a live worker of the stream is idle (it holds no message): that worker takes the queued loop (a new
  message at once, a dead worker's within `dead_after`);
- of the busy live workers, only the one with the smallest name yields. Every busy worker either finishes what it
  runs (and is idle) or reaches a wait of its own (and asks here), so the queued loop always gets a worker: no
  deadlock, and replicas outnumbering workers still take turns, on that one worker. The others keep their
  replicas, and their waits end once the queued loop has sent its values.

All of it is read from the work stream's pending list and the liveness keys: no key is added, and two workers
reading at the same moment reach the same answer.
"""
from ravop.store import GROUP
from ravop.store import workers as liveness


def work_queued(client, stream, takeover):
    """Whether the stream holds a message no worker has read yet, or one a dead worker held."""
    group = next((g for g in client.xinfo_groups(stream) if g["name"] in (GROUP, GROUP.encode())), None)
    last = client.xinfo_stream(stream)["last-generated-id"]
    if group is not None and group["last-delivered-id"] != last:
        return True
    return takeover.claimable()


def should_hand_back(client, stream, kind, name, takeover):
    """Whether worker `name`, waiting in a loop, should hand it back now (see the module's rule)."""
    if not work_queued(client, stream, takeover):
        return False
    live = set(liveness.alive(client, kind)) | {name}
    holders = {_text(c["name"]) for c in client.xpending(stream, GROUP)["consumers"]}
    busy = live & holders | {name}   # this worker holds the loop it waits in
    if live - busy:
        return False   # an idle worker takes the queued loop
    return name == min(busy)


def _text(value):
    return value.decode() if isinstance(value, bytes) else value
