"""How many loops of a plan read each exchange channel (resident replicas' `Step.receive`): stored with the
graph's meta as `exchange_readers`, so that a worker deletes an exchanged value once that many loops have
checkpointed past it (worker/loops/exchange.py) and the store holds only the rounds since the last checkpoints."""
import json
from typing import Any, Dict

from ..wire.loop_message import received_channels


def exchange_readers(plan: Any) -> Dict[str, int]:
    """{channel: number of loop subgraphs whose templates receive it} of a compiled plan."""
    readers: Dict[str, int] = {}
    for subgraph in plan.subgraphs:
        if subgraph.HasField("loop"):
            for channel in received_channels(subgraph.loop):
                readers[channel] = readers.get(channel, 0) + 1
    return readers


def readers_meta(plan: Any) -> Dict[str, str]:
    """The graph meta field holding them ({} for a plan without exchanges)."""
    readers = exchange_readers(plan)
    return {"exchange_readers": json.dumps(readers)} if readers else {}
