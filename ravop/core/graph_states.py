"""The states of a graph in the store, spelled once: its `meta` hash's `state` field (and the Lua scripts in
`ravop.store.scripts` that move it) go activated -> running -> done | failed | cancelled."""
from typing import Final, Literal

GraphState = Literal["activated", "running", "done", "failed", "cancelled"]

ACTIVATED: Final = "activated"   # uploaded by R.activate(), waiting for R.execute()
RUNNING: Final = "running"       # executing: workers take its subgraphs
DONE: Final = "done"             # every subgraph ran; persisted values can be fetched (a loop stopped early too)
FAILED: Final = "failed"         # a worker's error or the dead-letter stream ended it
CANCELLED: Final = "cancelled"   # its requester (`ravop cancel`, the dashboard) ended it

LIVE: Final = (ACTIVATED, RUNNING)           # may still change
ENDED: Final = (DONE, FAILED, CANCELLED)     # final
UNFINISHED: Final = (FAILED, CANCELLED)      # final without every value computed
