"""Delete a token's keys (R.flush) in time proportional to what the token owns, not to the server's keyspace.

A SCAN for the token's pattern walks every key on the server: 4-7 ms per flush on a store of 46,000 keys of
other tokens, paid before each fit of a benchmark or a notebook. Every graph is recorded in the token's `owned`
set before its first key is written (`ravop.store.graphs.upload`), and the names of its keys follow from its
records: the fixed ones, per subgraph its checkpoint, votes and segments, and a tensor key (with its chunks)
per id its `info` hash releases or its `persist` hash names (every constant and every subgraph output is one
or the other). So they are deleted by name.

A graph whose records may not name all of its keys is deleted by the SCAN as before, as is every graph of a
token where one is: one still running or not ended done (a worker may be writing, or died writing a
checkpoint), one where a worker took over a subgraph another held (`redelivered`: the one that died may have
left a checkpoint's tensors under a step no record names), one that still holds a checkpoint, a spot-checked
one (its segments' checkpoints), one under R.Graph(verify=k) (its results' seals, one key per principal,
ravop.store.seals), one whose loops exchange values (`exchange_readers`: per-run keys), a
federated one, one whose loops persist more than `NAMED_RULE_RUNS` values by rule (`persist_rules`: a fit of
10**6 epochs, whose keys exist only up to the step it reached; fewer are named from their rules), and one listed
by a version that did not record `owned` (in `graphs` but not `owned`) (a
checkpoint is looked for in the round trip that deletes the named keys; the SCAN then deletes what is left)."""
from typing import List, Optional, Tuple

from ..core import graph_states
from ..core.persist_rules import PersistRule
from . import background_upload, same_host
from .client_types import Client
from .keys import GraphKeys, TokenKeys
from .tensors import keys_of

# Every fixed key of a graph (ravop.store.keys.GraphKeys), by attribute.
_FIXED = ("meta", "subgraphs", "info", "deps", "done", "refs", "persist", "persist_rules", "bundles", "taken", "ran",
          "held", "events", "outbox", "steps", "disputes", "attempts")
_META = ("state", "redelivered", "spot", "exchange_readers", "approach", "verify")
_BY_NAME = (graph_states.DONE, graph_states.ACTIVATED)   # nothing writes to these any more, or has yet
NAMED_RULE_RUNS = 100_000   # a graph's persist rules naming more values than this are deleted by the SCAN


def delete_token(client: Client, token: str, batch: int = 1000) -> None:
    """Delete every key of a token (idempotent). Streams shared by all tokens are left alone: a worker that
    later reads a queued message of a deleted graph finds no meta and drops it. This process's same-host files
    of the token go too, after its uploads still under way have stopped (nothing is written after the delete)."""
    background_upload.abandon(token)
    same_host.remove_files(token)
    found = owned_keys(client, token)
    if found is None:
        return _scan_delete(client, TokenKeys(token).pattern, batch)
    slots, checkpoints = found
    pipe = client.pipeline(transaction=False)
    for key in checkpoints:          # one key a command: a cluster's pipeline refuses keys of several slots
        pipe.exists(key)
    for keys in slots:   # one command per slot (a graph's keys share one); a cluster pipeline's unlink() takes one key
        pipe.execute_command("UNLINK", *keys)
    replies = pipe.execute()
    if any(replies[:len(checkpoints)]):   # a loop's checkpoint left behind names tensors under steps of its own
        _scan_delete(client, TokenKeys(token).pattern, batch)


def owned_keys(client: Client, token: str) -> Optional[Tuple[List[List[str]], List[str]]]:
    """(every key name the token's records say it may hold, in lists of keys of one hash slot each, its loops'
    checkpoint hashes among them), or None if some graph's records may not name all of its keys (see the module
    docstring)."""
    token_keys = TokenKeys(token)
    pipe = client.pipeline(transaction=False)
    pipe.zrange(token_keys.graphs, 0, -1)
    pipe.smembers(token_keys.owned)
    listed, owned = pipe.execute()
    if not set(listed) <= owned:
        return None
    graphs = [GraphKeys(token, gid.decode()) for gid in sorted(owned)]
    for keys in graphs:
        pipe.hmget(keys.meta, *_META)
        pipe.hgetall(keys.info)
        pipe.hvals(keys.persist)
        pipe.hvals(keys.persist_rules)
    replies = pipe.execute(raise_on_error=False)
    if any(isinstance(reply, Exception) for reply in replies):   # damaged records: they cannot name the keys
        return None
    try:
        return _named(token_keys, graphs, replies)
    except ValueError:                                              # a record that does not parse, likewise
        return None


def _named(token_keys: TokenKeys, graphs: List[GraphKeys],
           replies: list) -> Optional[Tuple[List[List[str]], List[str]]]:
    """`owned_keys`'s answer from the graphs' meta, info and persist replies: the token's own keys one a list (each
    in a slot of its own), then each graph's keys in one list (one slot: its hash tag)."""
    slots = [[key] for key in (token_keys.graphs, token_keys.current, token_keys.banned, token_keys.trust,
                               token_keys.inbox, token_keys.owned)]
    checkpoints = []
    for keys, meta, info, persisted, rules in zip(graphs, replies[::4], replies[1::4], replies[2::4], replies[3::4]):
        state, redelivered, spot, exchanges, approach, copies = meta
        rules = [PersistRule.decode(rule) for rule in rules]
        # no state: gone, or an upload that stopped before its meta (its records come before its constants)
        if state is not None and (state.decode() not in _BY_NAME or redelivered or spot or exchanges or
                                  approach == b"federated" or int(copies or 1) > 1):
            return None
        named = [getattr(keys, name) for name in _FIXED]
        ids = {int(i) for i in persisted}
        if sum(len(rule.names) for rule in rules) > NAMED_RULE_RUNS:
            return None
        for rule in rules:
            ids.update(range(rule.first_id, rule.first_id + len(rule.names)))
        for sid, routing in info.items():
            sid = sid.decode()
            checkpoints.append(keys.checkpoint(sid))
            named += [keys.checkpoint(sid), keys.votes(sid), keys.segments(sid)]
            released = routing.decode().rsplit(";", 1)[-1]
            ids.update(int(i) for i in released.split(",") if i)
        named += [key for i in sorted(ids) for key in keys_of(keys.tensor(i))]
        slots.append(named)
    return slots, checkpoints


def _scan_delete(client: Client, pattern: str, batch: int) -> None:
    found = []
    for key in client.scan_iter(match=pattern, count=batch):
        found.append(key)
        if len(found) >= batch:
            client.unlink(*found)
            found = []
    if found:
        client.unlink(*found)
