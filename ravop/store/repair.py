"""Shared structures put back as the protocol made them: the work streams (one per device kind, each with
the workers' consumer group) and the dead-letter stream. A stranger with write access, or an operator's
mistake, can replace one by another type (workers then meet WRONGTYPE) or destroy its consumer group (NOGROUP);
every worker start, `ravop admin` and a worker meeting such an error calls `work_streams`.

A key of another type holds nothing of the protocol (its messages are gone already), so it is deleted and the
stream made again; a group made again starts from the stream's first entry: messages still in the stream are
delivered again (a claimed subgraph runs once, ravop.store.scripts) and acked ones were deleted by their ack.
"""
from typing import List

from .client_types import Client
from .connect import ensure_queues
from .keys import DEAD_LETTER, DEVICE_KINDS, GROUP, queue


def work_streams(client: Client) -> List[str]:
    """Repair the work and dead-letter streams; returns a line per repair (none when all were sound). The
    server's refusal (NoPermissionError for a user without the rights) is raised."""
    repaired, found = [], {}
    for key in [queue(kind) for kind in DEVICE_KINDS] + [DEAD_LETTER]:
        kind = client.type(key)
        found[key] = kind.decode() if isinstance(kind, bytes) else kind
        if found[key] not in ("stream", "none"):
            client.delete(key)
            repaired.append(f"{key} was a {found[key]}, not a stream: made an empty stream again")
    repaired += [f"{key} had lost its consumer group {GROUP!r}: made again" for key in ensure_queues(client)
                 if found[key] == "stream"]
    return repaired
