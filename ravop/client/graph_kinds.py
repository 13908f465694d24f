"""The kinds of graph a session runs, by the graph's `approach`: a planned graph ("distributed": compiled to a
plan of subgraphs that workers run) and a federated one (statistics of data that stays on the providers,
`ravop.client.federated_graphs`). The session asks the kind of its graph; it never tests which one it has.

A kind has four steps:
  activate(session, graph, compile_options) -> (summary, {persist name: node id} fetchable without a lookup: a
                                              Mapping, the names of loop steps' rules matched, not listed)
  start(client, keys)                         after the graph's state became running
  waiting(client, keys, meta) -> str          what a running graph waits for besides workers ("" for nothing)
  fetch(session, keys, name, wait, deadline)  the value persisted as `name`
"""
import json
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Protocol, Tuple, Union

from .. import parallel
from ..core import progress
from ..core.errors import GraphStateError, UnknownPersistName
from ..core.persist_rules import PersistedIds, PersistRule
from ..parallel.hand_written import record_replica_loops
from ..store import GraphKeys
from ..store import graphs as store_graphs
from ..store import worker_info
from ..store.client_types import Client
from ..store.scripts import is_cluster
from ..wire.persisted import persisted_ids
from .exchange_readers import readers_meta
from .federated_graphs import APPROACH as FEDERATED, FederatedGraphs
from .fetched_tensor import fetched
from .placement import replica_subgraphs
from .stored_values import LOADERS, fetch_tensor, read_meta

if TYPE_CHECKING:
    from ..record.graph import Graph
    from .session import Session

PLANNED = "distributed"   # the original's name for a graph that workers compute


class GraphKind(Protocol):
    def activate(self, session: "Session", graph: "Graph",
                 compile_options: Dict[str, Any]) -> Tuple[dict, Mapping[str, int]]: ...

    def start(self, client: Client, keys: GraphKeys) -> None: ...

    def waiting(self, client: Client, keys: GraphKeys, meta: Dict[str, str]) -> str: ...

    def fetch(self, session: "Session", keys: GraphKeys, name: str, wait: bool, deadline: Optional[float]) -> Any: ...


class Summary(dict):
    """What R.activate() returns: the compiler's counts, printed as one line."""

    def __str__(self) -> str:
        return (f"graph {self['name']!r} ({self['graph_id']}): {self['recorded_ops']} ops recorded, "
                f"{self['compiled_ops']} to run in {self['subgraphs']} subgraphs, ~{self['flops']:.3g} FLOPs, "
                f"up to {self['max_parallel_width']} subgraphs at once"
                + (f", {self['loop_steps']} loop steps" if self.get("loop_steps") else "")
                + (f", ~{self['estimated_handoff_seconds']:.2g} s of transfers between subgraphs"
                   if self.get("placement") else "")
                + "".join(f"\n{strategy}: " + (", ".join(f"{role} on {worker}" for role, worker in where.items())
                                               or "no live worker yet")
                          for strategy, where in self.get("placement", {}).items()))


def compile_planned(graph: "Graph", **compile_options: Any) -> Any:
    """`compiler.compile_graph` of `graph`; a graph whose strategy is its hand-written loops' has the strategy's
    replicas of each loop the compiler folds recorded here first (the compiler rewrites what it is given and
    records nothing)."""
    from compiler import compile_graph, folded_loops  # ravop depends on the compiler only here (architecture.md)
    replicas = [record_replica_loops(graph.strategy, *loop, graph.seed) for loop in folded_loops(graph)]
    if replicas:
        compile_options["replicas"] = replicas
    return compile_graph(graph, **compile_options)


class PlannedGraphs:
    """A graph compiled to a plan of subgraphs, uploaded with its constants, run by the workers."""

    def activate(self, session: "Session", graph: "Graph",
                 compile_options: Dict[str, Any]) -> Tuple[dict, Mapping[str, int]]:
        if not graph.persisted and not graph.step_outputs:
            raise GraphStateError(f"graph {graph.name!r} persists no op, so there is nothing to compute: call "
                                  "op.persist_op(name) on the values to fetch, then R.activate()")
        from compiler.cost import calibrated
        workers = worker_info.read_all(session.client)   # their measured cost figures, and placement below
        compile_options.setdefault("devices", calibrated(workers))
        # a part recorded in several forms (a fit's resident replicas or segments): the one these workers suit
        notes = graph.strategy_notes
        forms = compile_options.setdefault("forms", [part.choose(len(workers)) for part in notes.forms])
        with progress.busy(f"compiling {graph.name!r} ({len(graph.nodes):,} ops)"):
            compiled = compile_planned(graph, **compile_options)
        summary = Summary(name=graph.name, graph_id=graph.id, **compiled.summary)
        if notes.forms:
            summary["forms"] = {part.what: form for part, form in zip(notes.forms, forms)}
        strategies = notes.fits or [graph.strategy] * (graph.strategy is not None)   # or hand-written loops
        if strategies:
            kind = "cuda" if graph.gpu_required else "cpu"   # the stream a worker of that kind reads
            summary["placement"] = {repr(s): parallel.forecast(s, workers, kind) for s in strategies}
        if notes.fits:
            summary["replica_subgraphs"] = replica_subgraphs(graph, compiled.plan)   # read back by held_by
            summary["replica_rounds"] = notes.rounds                        # ... and by contributions,
            summary["loop_steps"] = {s.id: s.loop.n_steps for s in compiled.plan.subgraphs   # with each loop's
                                     if s.HasField("loop")}                                 # steps, syncs included
        if graph.verify > 1 and compiled.plan.n_steps:
            raise GraphStateError(f"graph {graph.name!r} has training loops, which verify={graph.verify} does not "
                                  "cover yet (a loop runs as a whole on one worker): leave verify= out")
        meta = {"name": graph.name, "algorithm": graph.algorithm, "approach": graph.approach,
                "rules": json.dumps(graph.rules), "summary": json.dumps(summary), "verify": graph.verify,
                **readers_meta(compiled.plan)}
        if graph.spot is not None:
            if strategies:
                raise GraphStateError(f"graph {graph.name!r} has verify='spot' and training under a strategy, whose "
                                      "replicas exchange values as they run, which a segment's re-run on another "
                                      "worker does not cover yet: leave strategy= or verify= out")
            if is_cluster(session.client):
                raise GraphStateError(f"graph {graph.name!r} has verify='spot', whose trust records live in the "
                                      "token's keys, another slot than the graph's on a Redis Cluster: use a "
                                      "standalone server, or verify=k")
            meta["spot"] = graph.spot.encode()
        store_graphs.upload(session.client, session.token, compiled.plan, compiled.constants, meta, graph.bundles)
        names = persisted_ids(compiled.plan)
        return summary, PersistedIds({n: i for n, i in names.listed.items() if n not in graph.bundles}, names.rules)

    def start(self, client: Client, keys: GraphKeys) -> None:
        """Its first subgraphs are enqueued by the start itself (`ravop.store.handoff`)."""

    def waiting(self, client: Client, keys: GraphKeys, meta: Dict[str, str]) -> str:
        return ""   # the workers it waits for are named by the tracker, for every kind

    def fetch(self, session: "Session", keys: GraphKeys, name: str, wait: bool, deadline: Optional[float]) -> Any:
        """A persisted tensor, or the object a saved bundle's loader builds."""
        pipe = session.client.pipeline(transaction=False)
        pipe.hget(keys.persist, name)
        pipe.hget(keys.bundles, name)
        pipe.hvals(keys.persist_rules)
        node_id, bundle, rules = pipe.execute()
        rules = [PersistRule.decode(rule) for rule in rules]
        if node_id is None and bundle is None:   # a name of a loop step's rule (a fit's loss)?
            node_id = PersistedIds({}, rules).get(name)
        if bundle is not None:
            info = json.loads(bundle)
            loader = LOADERS.get(info["kind"])
            if loader is None:
                raise GraphStateError(f"{name!r} is a saved {info['kind']!r} object and no loader is registered "
                                      "for that kind: import the package that saved it (e.g. ravdl.v2)")
            tensors = {key: fetch_tensor(session, keys, stored, session.client.hget(keys.persist, stored), wait,
                                         deadline)
                       for key, stored in info["keys"].items()}
            return loader(info["spec"], tensors)
        if node_id is None:
            meta = read_meta(session, keys)
            names = sorted(n.decode() for n in session.client.hkeys(keys.persist))
            shown = ", ".join(names[:20] + ["..."] * (len(names) > 20) + [
                f"{rule.names.template!r} for epochs {rule.names.epochs} and batches {rule.names.batches}"
                for rule in rules])
            raise UnknownPersistName(f"no op was persisted as {name!r} in graph {meta['name']!r} "
                                     f"({keys.graph_id}); persisted names: {shown or 'none'}")
        return fetched(fetch_tensor(session, keys, name, node_id, wait, deadline))


KINDS: Dict[str, GraphKind] = {PLANNED: PlannedGraphs(), FEDERATED: FederatedGraphs()}


def kind_of(approach: Union[None, str, bytes]) -> GraphKind:
    """The kind of a graph of `approach` (a Graph's, or its meta's as str or bytes; a graph without one is
    planned)."""
    if isinstance(approach, bytes):
        approach = approach.decode()
    try:
        return KINDS[approach or PLANNED]
    except KeyError:
        raise GraphStateError(f"unknown graph approach {approach!r}; known: {', '.join(KINDS)}") from None
