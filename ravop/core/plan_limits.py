"""How big one subgraph's plan may be. A plan is data from the network to a worker: one of millions of nodes
costs it a gigabyte and minutes to decode and check before anything runs (and past a few million, protobuf's
arena fails). The requester refuses such a plan at upload, with the numbers, and a worker refuses one it is
given before decoding it (plan bytes) and before checking it (nodes). Real plans are far smaller: a training
step is a template run in a loop (ravop.record.loop), not unrolled, and a long unrolled chain is split into
subgraphs by the compiler.

$RAVOP_MAX_SUBGRAPH_NODES and $RAVOP_MAX_PLAN_BYTES change the limits (a worker reads its own environment).
"""
import os

from .errors import PlanError

DEFAULT_NODES = 200_000
DEFAULT_BYTES = 64 * 2**20


def _limit(name: str, default: int) -> int:
    value = int(os.environ.get(name, default))
    if value < 1:
        raise ValueError(f"{name} must be positive, not {value}")
    return value


def max_nodes() -> int:
    return _limit("RAVOP_MAX_SUBGRAPH_NODES", DEFAULT_NODES)


def max_bytes() -> int:
    return _limit("RAVOP_MAX_PLAN_BYTES", DEFAULT_BYTES)


def check_bytes(subgraph_id: object, size: int) -> None:
    """PlanError if a subgraph's encoded plan of `size` bytes is over the limit."""
    if size > max_bytes():
        raise PlanError(f"subgraph {subgraph_id}'s plan is {size:,} bytes, more than the {max_bytes():,} allowed "
                        "($RAVOP_MAX_PLAN_BYTES): run the work as a loop (ravop.record.loop) or in several graphs")


def check_nodes(subgraph_id: object, count: int) -> None:
    """PlanError if a subgraph of `count` nodes is over the limit."""
    if count > max_nodes():
        raise PlanError(f"subgraph {subgraph_id} has {count:,} nodes, more than the {max_nodes():,} allowed "
                        "($RAVOP_MAX_SUBGRAPH_NODES): run the work as a loop (ravop.record.loop) or in several graphs")


def check_plan(plan: object) -> None:
    """Every subgraph of a `ravop.wire.plan_pb2.Plan` within the limits, before it is uploaded."""
    for sub in plan.subgraphs:  # type: ignore[attr-defined]
        check_nodes(sub.id, len(sub.nodes.id))
        check_bytes(sub.id, sub.ByteSize())
