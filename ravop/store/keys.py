"""Key names of the Redis schema that the requester and the workers share.

Per token (one requester), under `ravop:{token}:`:
  graphs              zset    graph id -> creation time: the token's graphs, oldest first
  current             string  the graph id that R.track_progress and R.fetch_persisting_op use
  banned              set     principals whose outputs a majority outvoted (R.Graph(verify=k) or 'spot'): they
                              take no more of this token's work; written by the token's requester only
                              (ravop.client.bans), read by workers
  trust               hash    R.Graph(verify='spot'): "user@class:streak|confirmed|mismatches|unchecked" ->
                              count (ravop.core.spot_policy); written only by the SPOT script
  inbox               zset    graph id -> when: graphs a `ravop admin` token user started; it may not write
                              the work streams, so workers start them for it (ravop.store.inbox)
  owned               set     ids of the token's graphs whose keys may exist: added before a graph's first key
                              is written, so that R.flush finds them without a SCAN (ravop.store.flush)
Per graph, under `ravop:{token}:{{token}.{gid}}:`: the braces are a Redis Cluster hash tag, so every key of
one graph lives in one hash slot (its Lua scripts and MULTIs are atomic on a cluster too) while different
graphs spread over the shards:
  meta                hash    name, algorithm, approach, devices, seed, verify, roots, state (activated, running,
                              done, failed), n_subgraphs, done_subgraphs, n_ops, ops_done, created,
                              started, finished, summary; a failed graph also has error, error_op,
                              error_source, error_worker, error_subgraph; `redelivered` once a worker took
                              over a subgraph another one held (keys it may have left: ravop.store.flush);
                              `outvoted` (",a,b,"): principals a spot check of this graph outvoted, kept
                              from its work at once (the SPOT script)
  subgraphs           hash    subgraph id -> Subgraph protobuf bytes
  info                hash    subgraph id -> "device;n_ops;successor,...;input to release,..." (for Lua)
  deps                hash    subgraph id -> predecessors not finished yet
  done                set     finished subgraph ids: completion runs once however often a subgraph is retried
  refs                hash    node id -> subgraphs that still read it; the value is deleted at zero
                              (persisted values are never counted, so never deleted); "early:{sid}:{id}": loop
                              subgraph sid released input id at its first checkpoint (scripts.RELEASE_SUPERSEDED)
  persist             hash    persist name -> node id (names given one by one)
  persist_rules       hash    index -> a name rule of loop steps, an encoded `ravop.core.persist_rules.PersistRule`
                              ("first_id first_epoch epochs first_batch batches template"): the rule's k-th name
                              is node first_id + k (a fit of 10**6 epochs holds a rule, not 2 million entries)
  bundles             hash    bundle name -> JSON {kind, spec, keys}
  taken               hash    subgraph id -> the worker that last started it
  ran                 hash    subgraph id -> the worker that finished it
  held                hash    subgraph id -> the workers that claimed it, in order, comma-separated (a name
                              again only after another's claim: a takeover, a turn; ravop.store.contributions)
  events              stream  one entry when the graph ends (done or failed), for trackers to block on
  outbox              hash    on a cluster, subgraph id -> device of subgraphs that became ready and were
                              not claimed yet (ravop.store.handoff)
  steps               hash    loop subgraph id -> its steps done (written as the loop runs)
  ckpt:{sid}          hash    a running loop's checkpoint: step (steps done), n (carried tensors), same, shared,
                              replaces, replaced (worker/loops/loop_subgraph.py), copied (seconds the loop spent
                              copying its state for checkpoints on this worker)
  ckpt:{sid}:writing  string  the step of the checkpoint whose chunks are going up ahead of its transaction (which
                              deletes it); a loop resuming deletes the chunks of the step it names
                              (worker/loops/loop_subgraph.py)
  ckpt:v:{digest}     string  a checkpoint value stored once for the loops whose checkpoints name it, by digest
                              (worker/loops/shared_checkpoint.py); ckpt:v:{digest}:refs, set: "{sid}:{step}" of those;
                              ckpt:v:{digest}:claim, string (expiring): the checkpoint uploading it
  ckpt:rounds         string  the rounds between resident replicas' periodic checkpoints, agreed by the first
                              to propose it (worker/loops/sync_cadence.py)
  policy              string  verify='spot': the policy (ravop.core.spot_policy.Verify.encode) as the requester set
                              it, written by the requester only; the SPOT script and the requester read it here
  votes:{sid}         hash    R.Graph(verify=k) and verify='spot': the principals that voted (principal -> 1);
                              `#narrowed...` fields: a dispute's narrowing recorded (diagnostics)
  votes:{sid}:{seg}   hash    the same for segment `seg` of a loop subgraph (verify='spot')
  vote:{sid}[:{seg}]:{user}  hash  worker user `user`'s vote on the subgraph (or segment): d (its digest), c (its
                              numerics class), t (server time), o (the runner's draw), v (a deadline's verdict);
                              only that user may write it, once; a check's state is derived from these
                              (ravop.store.votes)
  seal:{node}:{user}  string  worker user `user`'s digest of node's value computed under a vote; only that
                              user may write it (ravop.store.seals)
  sealers:{node}      set     the principals that sealed node's value
  constants           hash    node id -> SHA-256 of a constant as its requester uploaded it (graphs under verify);
                              written by the requester only, checked by each worker that reads the constant
                              (ravop.store.seals)
  traces:{sid}:{seg}  hash    a disputed loop segment's re-runs: "worker@kind" -> per-op digests of each step
                              (worker/verify/dispute_trace.py)
  disputes            stream  settled spot-check disputes: subgraph, segment, worker (the losers), op, source,
                              error (the text `ravop logs` shows)
  segs:{sid}          hash    a spot-checked loop's segments: seg -> "start;end;runner"; confirmed -> the
                              steps its confirmed prefix ends at (worker/verify/spot_loop.py)
  t:{node}            string  a tensor (ravop.wire.codec)
  t:{node}:c          hash    chunk index -> raw data of a tensor too big for one value (ravop.store.tensors)
  t:{node}:f          string  "boot id:pid:fd:nonce:bytes": a big constant's sealed memfd, which workers of the
                              requester's host and user map instead of the chunks (ravop.store.same_host)
  t:{node}:u          hash    header, sent, patience: a big constant whose chunks its requester is still sending
                              after the graph's start; deleted with the header's write (background_upload)
Shared by all tokens, under `ravop:_:` (a token starts with a letter or a digit, so it cannot collide); the
work streams, the dead letters and the starting marks share the hash tag `{work}`, so that acking a message and
dead-lettering it, or delivering a graph's first subgraphs and clearing its mark, is atomic on a cluster too:
  {work}:queue:{cpu|cuda}  stream  ready subgraphs {token, graph, subgraph}; consumer group "workers"
  {work}:dead         stream  messages and subgraphs given up on: reason, error, op, source, worker
  {work}:starting     zset    on a cluster, "token/graph id" of graphs being started -> when (ravop.store.handoff)
  worker:{name}       string  a live worker's device kind; expires unless the worker's heartbeat renews it
  workers:{cpu|cuda}  set     names of workers that registered for a device kind (dead ones pruned on read)
  winfo:{name}        hash    a live worker's advertisement: device, memory, threads, cost figures, what it runs
  tokens              set     names of the `ravop admin` token users, whose inboxes workers read (only
                              `ravop admin` writes it)
  quota:{token}       hash    a token's quotas and weight, written by `ravop admin token create/set` only:
                              max_memory (bytes), max_workers, max_worker_seconds, weight (ravop.store.quotas)
  usage:{token}       hash    what a token used: worker_seconds (added as workers run its subgraphs), and
                              run:{worker} -> "graph/subgraph" for each subgraph of it a worker runs now,
                              held: its graphs the inboxes held back for fair share at their last look
  started             channel (pub/sub, not a key) rung by a token user after posting to its inbox, so that a
                              worker looks at the inboxes at once
Federated graphs (ravop.store.federated_schema) add, shared by all tokens:
  federated:open      set     "token/graph id" of started federated graphs that still need providers
  provider:{name}     string  JSON {"columns": [...]}: the numeric columns a live provider holds; expires
                              with the worker's heartbeat, which renews it
  providers           set     names of workers that advertised data (dead ones pruned on read)
and per graph, under its prefix:
  stats               hash    persist name -> statistic (mean, variance, ...)
  clients             hash    provider -> "joined" | "done"
  partials            hash    provider -> JSON {column: {count, mean, m2, min, max} | {"withheld": k}}
Every key name is spelled in this module only; the other modules of both sides ask it.
"""
import hashlib
import re
from typing import Union

GROUP = "workers"
DEVICE_KINDS = ("cpu", "cuda")
SHARED = "ravop:_:"
WORK = SHARED + "{work}:"  # one slot on a cluster (see above)
DEAD_LETTER = WORK + "dead"
STARTING = WORK + "starting"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


def check_name(value: object, what: str = "token") -> str:
    """A token or graph id: 1-64 letters, digits, '_', '.', '-', starting with a letter or digit (so it is
    safe in key names and in SCAN patterns)."""
    if not isinstance(value, str) or not _NAME.match(value):
        # A long value may be a secret (a JWT given where a name belongs): never echo it.
        shown = repr(value) if not isinstance(value, str) or len(value) <= 64 else f"a {len(value)}-character string"
        raise ValueError(f"{what} must be 1-64 letters, digits, '_', '.' or '-' starting with a letter or "
                         f"digit, not {shown}")
    return value


def token_namespace(token: str) -> str:
    """The name a requester's keys live under. A token that is already a name ("local", "team-a") is used
    as it is; any other (a JWT of 150 characters, one with other characters) is a secret of any length, so
    only a digest of it goes into key names, where every worker and Redis user can read them."""
    if not isinstance(token, str) or not token:
        raise ValueError(f"a token must be a non-empty string, not a {type(token).__name__}")
    if _NAME.match(token):
        return token
    return "t" + hashlib.sha256(token.encode()).hexdigest()[:32]


def device_kind(device: object) -> str:
    """'cuda:1' -> 'cuda'; the queue a device reads."""
    kind = str(device).split(":", 1)[0]
    if kind not in DEVICE_KINDS:
        raise ValueError(f"unsupported device {device!r}: use cpu, cuda or cuda:N")
    return kind


def queue(kind: str) -> str:
    return f"{WORK}queue:{kind}"


def worker_key(name: str) -> str:
    return f"{SHARED}worker:{name}"


def workers_set(kind: str) -> str:
    return f"{SHARED}workers:{kind}"


def principal_key(principal: str) -> str:
    """A key that names a worker's principal (its ACL user) to the SPOT script. Never written: a worker user's
    scripts may name only its own (ravop.store.access), so the server, not the worker, vouches for whose vote
    it is."""
    return f"{SHARED}principal:{principal}:vote"


def info_key(name: str) -> str:
    """What a live worker advertises with each heartbeat (ravop.store.worker_info)."""
    return f"{SHARED}winfo:{name}"


def calibration_key(worker_name: str) -> str:
    """The tensor a starting worker writes and reads back to time a hand-off through Redis (worker.serve.calibrate):
    a key of the tensor pattern a worker's ACL user may write and delete, of a graph no token can have."""
    return graph_prefix("_", f"calibrate-{worker_name}") + "t:0"


TOKENS = SHARED + "tokens"
STARTED = SHARED + "started"  # a pub/sub channel, not a key: a token user rings it after posting to its inbox
FEDERATED_OPEN = SHARED + "federated:open"
PROVIDERS = SHARED + "providers"


def quota_key(token: str) -> str:
    """A token's quotas, out of its own key space: its user may read them, never write them."""
    return f"{SHARED}quota:{token}"


def usage_key(token: str) -> str:
    return f"{SHARED}usage:{token}"


def provider_key(name: str) -> str:
    return f"{SHARED}provider:{name}"


BANNED = "banned"
TRUST = "trust"
INBOX = "inbox"
ANY = "*"


def token_prefix(namespace: str) -> str:
    return f"ravop:{namespace}:"


def graph_prefix(namespace: str, graph_id: str) -> str:
    """`ravop:{namespace}:{{namespace}.{graph_id}}:` (with ANY for both: a pattern of every graph's keys)."""
    tag = ANY if namespace == ANY and graph_id == ANY else f"{namespace}.{graph_id}"
    return f"{token_prefix(namespace)}{{{tag}}}:"


class TokenKeys:
    __slots__ = ("graphs", "current", "banned", "trust", "inbox", "owned", "pattern")

    def __init__(self, token: str) -> None:
        base = token_prefix(check_name(token))
        self.graphs = base + "graphs"
        self.current = base + "current"
        self.banned = base + BANNED  # workers whose outputs disagreed with the others' (R.Graph(verify=k))
        self.trust = base + TRUST    # workers' spot-check records (R.Graph(verify='spot'))
        self.inbox = base + INBOX    # graphs started by a token user, for workers to start (ravop.store.inbox)
        self.owned = base + "owned"  # ids of the graphs whose keys may exist, for R.flush (ravop.store.flush)
        self.pattern = base + "*"


class GraphKeys:
    """The keys of one graph of one token."""
    __slots__ = ("token", "graph_id", "prefix", "meta", "subgraphs", "info", "deps", "done", "refs", "persist",
                 "persist_rules", "bundles", "taken", "ran", "held", "events", "outbox", "steps", "disputes",
                 "attempts", "tensor_prefix", "constants", "policy")

    def __init__(self, token: str, graph_id: str) -> None:
        self.token = check_name(token)
        self.graph_id = check_name(graph_id, "graph id")
        self.prefix = p = graph_prefix(token, graph_id)
        self.meta, self.subgraphs, self.info, self.deps = p + "meta", p + "subgraphs", p + "info", p + "deps"
        self.done, self.refs, self.persist, self.bundles = p + "done", p + "refs", p + "persist", p + "bundles"
        self.persist_rules = p + "persist_rules"
        self.taken, self.ran, self.events, self.steps = p + "taken", p + "ran", p + "events", p + "steps"
        self.outbox, self.disputes, self.held = p + "outbox", p + "disputes", p + "held"
        self.attempts = p + "attempts"   # what takeovers of each subgraph found (worker/serve/attempts.py)
        self.tensor_prefix = p + "t:"
        self.policy = p + "policy"   # its spot-check policy as its requester set it (ravop.store.votes)
        self.constants = p + "constants"   # digests of constants as uploaded (ravop.store.seals): the requester's only

    def tensor(self, node_id: Union[int, str]) -> str:
        return f"{self.tensor_prefix}{node_id}"

    def checkpoint(self, subgraph_id: Union[int, str]) -> str:
        return f"{self.prefix}ckpt:{subgraph_id}"

    def checkpoint_writing(self, subgraph_id: Union[int, str]) -> str:
        """The step of the checkpoint whose chunks are being written (set before them, deleted as it is published)."""
        return f"{self.checkpoint(subgraph_id)}:writing"

    def exchange(self, channel: str, run: int) -> str:
        """A value a resident replica's loop sends on `channel` at its `run`-th sync (worker/loops/exchange.py)."""
        return f"{self.prefix}x:{channel}:{run}"

    def votes(self, subgraph_id: Union[int, str], segment: Union[int, str, None] = None) -> str:
        return f"{self.prefix}votes:{subgraph_id}" + ("" if segment is None else f":{segment}")

    def vote(self, subgraph_id: Union[int, str], segment: Union[int, str, None] = None, principal: str = "") -> str:
        """`principal`'s vote on a subgraph or segment (ravop.store.votes); with no principal, the prefix of every
        principal's."""
        return f"{self.prefix}vote:{subgraph_id}" + ("" if segment is None else f":{segment}") + f":{principal}"

    def traces(self, subgraph_id: Union[int, str], segment: str) -> str:
        return f"{self.prefix}traces:{subgraph_id}:{segment}"

    def seal(self, node_id: Union[int, str], principal: str) -> str:
        """The digest of node `node_id`'s value that `principal` computed under a vote (ravop.store.seals): a worker
        user may write only its own (ravop.store.access)."""
        return f"{self.prefix}seal:{node_id}:{principal}"

    def sealers(self, node_id: Union[int, str]) -> str:
        """The principals that sealed node `node_id`'s value (ravop.store.seals)."""
        return f"{self.prefix}sealers:{node_id}"

    def segments(self, subgraph_id: Union[int, str]) -> str:
        return f"{self.prefix}segs:{subgraph_id}"


def graph_ref(keys: GraphKeys) -> str:
    """How the sets of graphs shared by all tokens (STARTING, FEDERATED_OPEN) name a graph: "token/graph id"."""
    return f"{keys.token}/{keys.graph_id}"


class FederatedKeys:
    """The keys a federated graph adds to its GraphKeys."""
    __slots__ = ("stats", "clients", "partials")

    def __init__(self, keys: GraphKeys) -> None:
        self.stats, self.clients, self.partials = (keys.prefix + k for k in ("stats", "clients", "partials"))


# Key patterns of the ACL users that `ravop admin` provisions (ravop.store.access), built from the same
# prefixes as the keys themselves so that the two cannot drift apart.

def token_pattern(namespace: str) -> str:
    """Every key of one requester."""
    return token_prefix(namespace) + ANY


def graphs_pattern() -> str:
    """Every key of every graph of every token (what workers read and write)."""
    return graph_prefix(ANY, ANY) + ANY


def tensors_pattern() -> str:
    """Every stored tensor and its chunks: the graph keys a worker may delete (releasing inputs)."""
    return graph_prefix(ANY, ANY) + "t:" + ANY


def checkpoints_pattern() -> str:
    return graph_prefix(ANY, ANY) + "ckpt:" + ANY


def exchanges_pattern() -> str:
    """The values resident replicas exchange and their acknowledgements: a worker deletes one once every loop
    that reads it has checkpointed past it (worker/loops/exchange.py)."""
    return graph_prefix(ANY, ANY) + "x:" + ANY


def banned_pattern() -> str:
    """The banned-workers set of every token."""
    return token_prefix(ANY) + BANNED


def trust_pattern() -> str:
    """The spot-check trust hash of every token (written by the SPOT script a worker runs)."""
    return token_prefix(ANY) + TRUST


def inbox_pattern() -> str:
    """The inbox of every token."""
    return token_prefix(ANY) + INBOX


def shared_pattern() -> str:
    """Every key shared by all tokens: queues, dead letters, worker liveness, federated providers."""
    return SHARED + ANY
