"""The federated kind of graph (approach='federated'), as the session sees it (`ravop.client.graph_kinds`): activate
checks the ops and the providers and uploads the rules; start opens the graph to providers; `waiting` says what
it waits for; `fetch` releases a statistic.

There is no plan: each provider that joins computes one partial per rule column over its own data
(`worker.provider.data_provider`, the `federated_partial` op), and the statistics are merged here, from the partials,
when they are fetched (the `federated_<statistic>` ops). Only partials are in Redis, so merging on the requester
shows it nothing more; a quantile's partial is a sketch, which holds some values as they are (as min and max
do), and a "secure" graph's partials are masked sums that only add up to the merged ones (`release.unmask`).
"""
import json
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple, Union

from ..core import graph_states
from ..core.errors import GraphStateError, UnknownPersistName
from ..federated.column_rules import Rules, parse_rules
from ..federated.histograms import edges as histogram_edges
from ..federated.partials import Partial, check_partial, merge, statistic
from ..federated.queries import Query, parse_queries, parse_query
from ..federated.release import Released, histogram, release_extra, unmask
from ..ops.federated_stats import PREFIX, STATISTIC_OPS
from ..store import federated_schema as store
from ..store import graphs as store_graphs
from ..store.client_types import Client
from ..store.federated_schema import APPROACH
from ..store.keys import FederatedKeys, GraphKeys, TokenKeys, graph_ref, worker_key
from .stored_values import not_ready

if TYPE_CHECKING:
    from ..record.graph import Graph
    from .session import Session

UNSUMMABLE = ("min", "max", "quantile")   # what neither "privacy" nor "secure" releases


class Summary(dict):
    """What R.activate() returns for a federated graph, printed as one line."""

    def __str__(self) -> str:
        return (f"graph {self['name']!r} ({self['graph_id']}): federated {', '.join(self['statistics'])} of "
                f"{', '.join(self['columns'])} on {self['max_clients']} provider(s); "
                f"{self['eligible_providers']} connected provider(s) hold these columns")


class FederatedResult(dict):
    """column -> value of one statistic (a float; a list of floats for several quantiles; {"edges", "counts"}
    for a histogram); `withheld` maps the columns not released to the reason."""

    def __init__(self, values: Dict[str, Any], withheld: Dict[str, str]) -> None:
        super().__init__(values)
        self.withheld = withheld


class FederatedGraphs:
    """Statistics of data that stays on the providers."""

    def activate(self, session: "Session", graph: "Graph",
                 compile_options: Dict[str, Any]) -> Tuple[dict, Mapping[str, int]]:
        """Check that the graph holds only federated statistics and that its columns exist, then upload it.
        Returns (the summary, {}: a statistic is always looked up in Redis at fetch)."""
        if compile_options:
            raise TypeError(f"a federated graph is not compiled: R.activate() takes no {', '.join(compile_options)}")
        for node in graph.nodes:
            if node.op not in STATISTIC_OPS:
                raise GraphStateError(f"graph {graph.name!r} is federated: it may hold only R.federated_* "
                                      f"statistics, but op {node.op!r} was recorded at {node.source}")
        if not graph.persisted:
            raise GraphStateError(f"graph {graph.name!r} persists no statistic: call e.g. "
                                  "R.federated_mean().persist_op('mean'), then R.activate()")
        rules = graph.rules
        if session.embedded is not None:
            session.embedded.wait_ready(session.client)  # its providers advertise their columns once started
        providers = store.live_providers(session.client)
        held = set().union(*providers.values()) if providers else set()
        unknown = [column for column in rules.columns if column not in held]
        if providers and unknown:
            raise ValueError(f"graph {graph.name!r}: no provider holds column(s) {', '.join(map(repr, unknown))}; "
                             f"the {len(providers)} connected provider(s) hold: "
                             f"{', '.join(sorted(held)) or 'no columns'}")
        eligible = [name for name, columns in providers.items() if set(rules.columns) <= set(columns)]
        if len(eligible) < rules.max_clients and session.embedded is not None:
            raise GraphStateError(
                f"graph {graph.name!r} needs {rules.max_clients} provider(s) holding {rules.describe_columns()}, "
                f"but the embedded default has {len(eligible)}, and no other can join its private server: give "
                "each provider's file(s) to R.initialize(data=[...]) (or $RAVOP_DATA), or run providers with "
                "`ravop-worker --data PATH` against a Redis server and R.initialize(redis_url=...)")
        if len(eligible) < rules.max_clients:
            print(f"graph {graph.name!r}: max_clients is {rules.max_clients} but {len(eligible)} connected "
                  f"provider(s) hold {rules.describe_columns()}; R.track_progress() waits for more (timeout= gives "
                  "up)", file=sys.stderr)
        queries = {name: query_of(op) for name, op in graph.persisted.items()}
        for name, query in queries.items():
            mode = "privacy" if rules.privacy else "secure" if rules.secure else None
            if mode and query.statistic in UNSUMMABLE:
                raise GraphStateError(f"graph {graph.name!r} has \"{mode}\" in its rules, under which "
                                      f"{query.statistic} (persisted as {name!r}) is not released: it is one "
                                      "person's value, or a summary made of them; ask mean, variance, "
                                      "standard_deviation, count or histogram")
        for query in queries.values():
            if query.statistic == "histogram" and query.range is None:
                for column, limits in rules.columns.items():
                    histogram_edges(query, column, limits)   # raises at activate if a rule has no range
        statistics = {name: query.to_json() for name, query in queries.items()}
        summary = Summary(name=graph.name, graph_id=graph.id,
                          statistics=sorted({query.statistic for query in queries.values()}),
                          columns=list(rules.columns), max_clients=rules.max_clients,
                          eligible_providers=len(eligible))
        keys = GraphKeys(session.token, graph.id)
        now = time.time()
        pipe = session.client.pipeline(transaction=True)  # the graph's keys: one slot (ravop.store.keys)
        pipe.hset(FederatedKeys(keys).stats, mapping=statistics)
        # A provider is one "subgraph" and one "op", so that progress, listing and completion work as for a plan.
        pipe.hset(keys.meta, mapping={
            "name": graph.name, "algorithm": graph.algorithm, "approach": APPROACH, "rules": rules.to_json(),
            "max_clients": rules.max_clients, "state": graph_states.ACTIVATED, "seed": graph.seed, "devices": "",
            "roots": "", "n_subgraphs": rules.max_clients, "done_subgraphs": 0, "n_ops": rules.max_clients,
            "ops_done": 0, "created": now, "summary": json.dumps(summary)})
        pipe.execute()
        token_keys = TokenKeys(session.token)
        pipe = session.client.pipeline(transaction=False)
        pipe.zadd(token_keys.graphs, {graph.id: now})
        pipe.set(token_keys.current, graph.id)
        pipe.execute()
        return summary, {}

    def start(self, client: Client, keys: GraphKeys) -> None:
        """Open the started graph to providers."""
        store.open_if_federated(client, keys)

    def waiting(self, client: Client, keys: GraphKeys, meta: Dict[str, str]) -> str:
        """What a running federated graph waits for, as a sentence; "" if the providers it needs are connected."""
        rules = parse_rules(client.hget(keys.meta, "rules"))
        clients = {name.decode(): state.decode()
                   for name, state in client.hgetall(FederatedKeys(keys).clients).items()}
        owing = ("joined", "done") if rules.secure else ("joined",)   # a secure graph's survivors owe their reveals
        gone = [name for name, state in clients.items() if state in owing and not client.exists(worker_key(name))]
        if gone:
            return (f"provider(s) {', '.join(sorted(gone))} joined graph {meta['name']!r} and stopped before "
                    "sending their statistics")
        needed = rules.max_clients - len(clients)
        available = [name for name, columns in store.live_providers(client).items()
                     if name not in clients and set(rules.columns) <= set(columns)]
        if needed <= len(available):
            return ""
        return (f"waiting for {needed - len(available)} more provider(s) holding {rules.describe_columns()} "
                f"({len(clients)} of {rules.max_clients} joined)")

    def fetch(self, session: "Session", keys: GraphKeys, name: str, wait: bool,
              deadline: Optional[float]) -> "FederatedResult":
        """The statistic persisted as `name`, {column: float}, merged from the providers' partials once all are
        in."""
        statistic_name = session.client.hget(FederatedKeys(keys).stats, name)
        if statistic_name is None:
            names = sorted(n.decode() for n in session.client.hkeys(FederatedKeys(keys).stats))
            raise UnknownPersistName(f"no statistic was persisted as {name!r} in federated graph {keys.graph_id}; "
                                     f"persisted names: {', '.join(names) or 'none'}")
        while True:
            pipe = session.client.pipeline(transaction=False)
            pipe.hgetall(FederatedKeys(keys).partials)
            pipe.hmget(keys.meta, store_graphs.STATE_FIELDS)
            pipe.hget(keys.meta, "rules")
            pipe.hgetall(FederatedKeys(keys).stats)
            pipe.hgetall(store.public_keys_key(keys))
            pipe.hgetall(store.reveals_key(keys))
            partials, meta, rules, stats, publics, reveals = pipe.execute()
            meta = store_graphs.decode_state(meta)
            if meta.get("state") == graph_states.DONE:
                return release(name, parse_query(statistic_name), rules, partials, parse_queries(stats).values(),
                               Secured(publics, reveals, graph_ref(keys)))
            not_ready(session, keys, name, meta, wait, deadline)


def query_of(op: Any) -> Query:
    """The query a recorded statistic op asks of the providers."""
    stat = op.op[len(PREFIX):]
    if stat == "quantile":
        return Query("quantile", q=op.params["q"], scalar=op.params["scalar"])
    if stat == "histogram":
        return Query("histogram", bins=op.params["bins"], range=op.params["range"])
    return Query(stat)


class Secured(NamedTuple):
    """What the release of a secure graph reads beyond its partials, as the store holds it: its public keys, its
    survivors' revealed shares, and its reference, to which its masks are bound."""
    publics: Mapping[bytes, bytes]
    reveals: Mapping[bytes, bytes]
    context: str


def release(name: str, query: Query, rules_json: Union[str, bytes], raw_partials: Mapping[bytes, bytes],
            queries: Iterable[Query], secured: Secured) -> FederatedResult:
    """The statistic `query` asks of every rule column, merged over the providers' partials (in name order);
    `queries`: all of the graph's, which lay out a secure graph's sums."""
    rules = parse_rules(rules_json)
    partials = {provider.decode(): json.loads(data) for provider, data in sorted(raw_partials.items())}
    if rules.secure:
        values, withheld = _release_secure(query, rules, partials, list(queries), secured)
    else:
        values, withheld = _release_plain(query, rules, partials)
    if withheld:
        warnings.warn(f"{name!r} ({query.statistic}) does not release " +
                      "; ".join(f"{column!r}: {why}" for column, why in withheld.items()), stacklevel=4)
    return FederatedResult(values, withheld)


def _release_secure(query: Query, rules: Rules, partials: Dict[str, Any], queries: List[Query],
                    secured: Secured) -> Tuple[Dict[str, Released], Dict[str, str]]:
    publics = {provider.decode(): key.decode() for provider, key in secured.publics.items()}
    reveals = {provider.decode(): json.loads(data) for provider, data in secured.reveals.items()}
    merged_columns, withheld, k = unmask(rules, queries, partials, publics, reveals, secured.context)
    dropped = sorted(set(publics) - set(partials))
    if dropped:   # closed without them (their processes stopped after the masks were set up): SecAgg+
        warnings.warn(f"the sum of {len(partials)} of {rules.max_clients} providers is released: provider(s) "
                      f"{', '.join(dropped)} dropped out after the masks were set up", stacklevel=5)
    values: Dict[str, Released] = {}
    for column, merged in merged_columns.items():
        if query.statistic == "histogram":
            values[column] = histogram(query, column, rules.columns[column], k,
                                       [merged["histograms"][query.histogram_key()]])
        else:
            values[column] = statistic(merged, query.statistic)
    return values, withheld


def _release_plain(query: Query, rules: Rules,
                   partials: Dict[str, Any]) -> Tuple[Dict[str, Released], Dict[str, str]]:
    values: Dict[str, Released] = {}
    withheld: Dict[str, str] = {}
    for column in rules.columns:
        merged: Partial = {"count": 0}
        for provider, columns in partials.items():
            part = columns.get(column)
            if part is not None and "withheld" in part:
                withheld[column] = (f"provider {provider} holds fewer than k={part['withheld']} values of it in "
                                    "range (minimum group size)")
                break
            merged = merge(merged, check_partial(part))
        else:
            if merged["count"] < rules.min_group_size or not merged["count"]:
                withheld[column] = f"fewer than k={rules.min_group_size} values in range (minimum group size)"
            elif query.statistic in ("quantile", "histogram"):
                values[column] = release_extra(query, column, rules.columns[column], rules.min_group_size,
                                               [columns[column] for columns in partials.values()])
            else:
                values[column] = statistic(merged, query.statistic)
    return values, withheld
