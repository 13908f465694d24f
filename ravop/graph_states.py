"""The states of a graph in the store, spelled once: its `meta` hash's `state` field (and the Lua scripts in
`ravop.store.scripts` that move it) go activated -> running -> done | failed."""
from typing import Final, Literal

GraphState = Literal["activated", "running", "done", "failed"]

ACTIVATED: Final = "activated"   # uploaded by R.activate(), waiting for R.execute()
RUNNING: Final = "running"       # executing: workers take its subgraphs
DONE: Final = "done"             # every subgraph ran; persisted values can be fetched
FAILED: Final = "failed"         # a worker's error, the dead-letter stream or the requester's cancel ended it

LIVE: Final = (ACTIVATED, RUNNING)   # may still change
ENDED: Final = (DONE, FAILED)        # final
