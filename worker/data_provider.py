"""A data provider's part in federated graphs: join the open ones whose rule columns it holds (up to their
`max_clients`), reduce each rule column of its own data to a partial (count, mean, M2, min, max of the values
the rule keeps: the `federated_partial` op's kernel) and write only that. A column with fewer than k values in range (k: the larger of
`--min-group-size` and the rules' `min_group_size`) is withheld, so no statistic describes fewer than k people.
A graph that asks quantiles also gets a KLL sketch of each column (`ravop.federated.sketches`), one that asks
histograms the bin counts (`ravop.federated.histograms`, bins of fewer than k values suppressed).
"""
import logging
import time

import numpy as np
import redis

from ravop.federated import histograms, sketches
from ravop.federated.column_rules import parse_rules
from ravop.federated.partials import partial
from ravop.federated.queries import parse_queries
from ravop.store import GraphKeys, Scripts, queue
from ravop.store.federated_schema import FederatedScripts
from ravop.store.keys import FEDERATED_OPEN, FederatedKeys, graph_ref

log = logging.getLogger("ravop.worker")
POLL_SECONDS = 0.25   # how often an idle provider looks for open federated graphs (at most)


class Provider:
    def __init__(self, client, name, data, min_group_size):
        if min_group_size < 1:
            raise ValueError(f"the minimum group size must be >= 1, not {min_group_size}")
        self.client, self.name, self.data, self.min_group_size = client, name, data, min_group_size
        self.scripts = FederatedScripts(client)
        self.graph_scripts = Scripts(client)
        self._next_poll = 0.0

    def poll(self):
        """Serve every open federated graph this provider can join (throttled to one look per POLL_SECONDS)."""
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_SECONDS
        for ref in self.client.smembers(FEDERATED_OPEN):
            try:
                token, graph_id = ref.decode().split("/", 1)
                keys = GraphKeys(token, graph_id)
            except (UnicodeDecodeError, ValueError):
                self.client.srem(FEDERATED_OPEN, ref)   # not a graph reference: nobody can serve it
                continue
            try:
                self._serve(keys)
            except redis.RedisError:
                raise
            except Exception as exc:  # a malformed graph fails, and this provider goes on serving
                log.exception("provider %s: federated graph %s", self.name, graph_id)
                self.graph_scripts.fail(keys, queue("cpu"), "", worker=self.name, reason="federated graph",
                                        error=f"{type(exc).__name__}: {exc}")
                self.client.srem(FEDERATED_OPEN, ref)

    def _serve(self, keys):
        rules_json = self.client.hget(keys.meta, "rules")
        if rules_json is None:   # flushed, or not a federated graph
            self.client.srem(FEDERATED_OPEN, graph_ref(keys))
            return
        rules = parse_rules(rules_json)
        if not set(rules.columns) <= set(self.data.columns):
            return
        queries = parse_queries(self.client.hgetall(FederatedKeys(keys).stats))
        if self.scripts.join(keys, self.name) != "joined":
            return
        self.scripts.contribute(keys, self.name, self.partials(rules, queries.values()))
        log.info("provider %s: sent partials of %s to graph %s", self.name, rules.describe_columns(), keys.graph_id)

    def partials(self, rules, queries=()):
        """{column: partial or {"withheld": k}} of this provider's data under `rules`; a partial also holds a
        "sketch" if a query asks quantiles and "histograms" {histogram key: counts} if some ask histograms."""
        k = max(self.min_group_size, rules.min_group_size)
        wants_sketch = any(query.statistic == "quantile" for query in queries)
        wanted_histograms = [query for query in queries if query.statistic == "histogram"]
        partials = {}
        for column, (low, high) in rules.columns.items():
            part = partial(self.data.columns[column], low, high)
            if part["count"] < k:
                partials[column] = {"withheld": k}
                continue
            values = _kept(self.data.columns[column], low, high)
            if wants_sketch:
                part["sketch"] = sketches.sketch(values)
            if wanted_histograms:
                part["histograms"] = {
                    query.histogram_key(): histograms.counts(values, histograms.edges(query, column, (low, high)), k)
                    for query in wanted_histograms}
            partials[column] = part
        return partials


def _kept(values, low, high):
    """The values a rule keeps: not missing, within [low, high] (the `federated_partial` op's filter)."""
    keep = ~np.isnan(values)
    if low is not None:
        keep &= values >= low
    if high is not None:
        keep &= values <= high
    return values[keep]
