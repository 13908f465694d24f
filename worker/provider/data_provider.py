"""A data provider's part in federated graphs: join the open ones whose rule columns it holds (up to their
`max_clients`), reduce each rule column of its own data to a partial (count, mean, M2, min, max of the values
the rule keeps: the `federated_partial` op's kernel) and write only that. A column with fewer than k values in range (k: the larger of
`--min-group-size` and the rules' `min_group_size`) is withheld, so no statistic describes fewer than k people.
A graph that asks quantiles also gets a KLL sketch of each column (`ravop.federated.sketches`), one that asks
histograms the bin counts (`ravop.federated.histograms`, bins of fewer than k values suppressed).

With `"privacy"` in the rules the provider releases noisy counts, sums, sums of squares and bin counts instead
(`ravop.federated.privacy`), charged first to its ledger (`worker.provider.privacy_ledger`); a provider given an
epsilon budget answers only such queries, since any other would release its data exactly.

With `"secure": true` it computes its sums at join and goes through the rounds of secure aggregation with the
other providers (`worker.provider.secure_rounds`); until they end, the graph waits among its pending ones.
"""
import logging
import time
from typing import Any, Iterable, Optional, Sequence, cast

import numpy as np
import redis

from ravop.federated import histograms, privacy, secure, sketches
from ravop.federated.column_rules import Rules, parse_rules
from ravop.federated.partials import partial
from ravop.federated.queries import Query, parse_queries
from ravop.store import GraphKeys, Scripts, queue
from ravop.store.federated_schema import FederatedScripts
from ravop.store.keys import FEDERATED_OPEN, FederatedKeys, graph_ref

from .data import ProviderData
from .privacy_ledger import BudgetExhausted, PrivacyLedger
from .secure_rounds import SecureRound

log = logging.getLogger("ravop.worker")
POLL_SECONDS = 0.25   # how often an idle provider looks for open federated graphs (at most)


class QueryRefused(ValueError):
    """A query this provider will not answer (its privacy settings); the graph fails with this reason."""


MOMENTS = {"mean": 2, "variance": 3, "standard_deviation": 3, "count": 1}   # how many of count, sum, squares


class Provider:
    def __init__(self, client: Any, name: str, data: ProviderData, min_group_size: int,
                 ledger: Optional[PrivacyLedger] = None) -> None:
        if min_group_size < 1:
            raise ValueError(f"the minimum group size must be >= 1, not {min_group_size}")
        self.client, self.name, self.data, self.min_group_size = client, name, data, min_group_size
        self.ledger = ledger   # a PrivacyLedger if the owner set an epsilon budget
        self.scripts = FederatedScripts(client)
        self.graph_scripts = Scripts(client)
        self._next_poll = 0.0
        self._pending: dict[str, SecureRound] = {}   # graph ref -> its rounds, of the secure graphs joined

    def in_rounds(self) -> bool:
        """Whether a secure graph waits for this provider's next round (its worker polls again soon)."""
        return bool(self._pending)

    def poll(self) -> None:
        """Serve every open federated graph this provider can join (throttled to one look per POLL_SECONDS)."""
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_SECONDS
        for ref in list(self._pending):
            self._step_secure(ref)
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
            except QueryRefused as exc:   # this provider's choice, not a fault: no traceback
                log.warning("provider %s refuses federated graph %s: %s", self.name, graph_id, exc)
                self.graph_scripts.fail(keys, queue("cpu"), "", worker=self.name, reason="federated graph",
                                        error=f"{type(exc).__name__}: {exc}")
                self.client.srem(FEDERATED_OPEN, ref)
            except Exception as exc:  # a malformed graph fails, and this provider goes on serving
                log.exception("provider %s: federated graph %s", self.name, graph_id)
                self.graph_scripts.fail(keys, queue("cpu"), "", worker=self.name, reason="federated graph",
                                        error=f"{type(exc).__name__}: {exc}")
                self.client.srem(FEDERATED_OPEN, ref)

    def _serve(self, keys: GraphKeys) -> None:
        rules_json = self.client.hget(keys.meta, "rules")
        if rules_json is None:   # flushed, or not a federated graph
            self.client.srem(FEDERATED_OPEN, graph_ref(keys))
            return
        rules = parse_rules(rules_json)
        if not set(rules.columns) <= set(self.data.columns):
            return
        queries = parse_queries(self.client.hgetall(FederatedKeys(keys).stats))
        self._check_privacy(rules, queries.values())
        if self.scripts.join(keys, self.name) != "joined":
            return
        if rules.secure:
            self._start_secure(keys, rules, list(queries.values()))
            return
        self.scripts.contribute(keys, self.name, self.partials(rules, queries.values(), graph_ref(keys)))
        log.info("provider %s: sent partials of %s to graph %s", self.name, rules.describe_columns(), keys.graph_id)

    def _check_privacy(self, rules: Rules, queries: Iterable[Query]) -> None:
        """Refuse, before joining, a query this provider will not answer (the graph fails with the reason)."""
        if rules.privacy is None:
            if self.ledger is not None:
                raise QueryRefused(f"provider {self.name} has an epsilon budget, so it answers only queries with "
                                 f"\"privacy\" in their rules ({self.ledger.remaining:g} of {self.ledger.budget:g} "
                                 "remains)")
            return
        if self.ledger is None:
            raise QueryRefused(f"provider {self.name} set no --epsilon-budget, so it answers no query with \"privacy\"")
        refused = sorted({q.statistic for q in queries} - set(MOMENTS) - {"histogram"})
        if refused:
            raise QueryRefused(f"{', '.join(refused)} cannot be released under \"privacy\" (each is one person's "
                             "value, or a summary made of them); ask mean, variance, standard_deviation, count or "
                             "histogram")
        try:
            self.ledger.check(rules.privacy[0])
        except BudgetExhausted as exc:
            raise QueryRefused(str(exc)) from None

    def partials(self, rules: Rules, queries: Iterable[Query] = (), graph: str = "") -> dict[str, dict[str, Any]]:
        """{column: partial or {"withheld": k}} of this provider's data under `rules`; a partial also holds a
        "sketch" if a query asks quantiles and "histograms" {histogram key: counts} if some ask histograms."""
        if rules.privacy is not None:
            return self._private_partials(rules, list(queries), graph)
        k = max(self.min_group_size, rules.min_group_size)
        wants_sketch = any(query.statistic == "quantile" for query in queries)
        wanted_histograms = [query for query in queries if query.statistic == "histogram"]
        partials: dict[str, dict[str, Any]] = {}
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

    def _private_partials(self, rules: Rules, queries: list[Query], graph: str) -> dict[str, dict[str, Any]]:
        """Partials from noisy releases; the ledger is charged before any is computed."""
        k = max(self.min_group_size, rules.min_group_size)
        moments = max([MOMENTS.get(query.statistic, 1) for query in queries] + [1])
        wanted_histograms = [query for query in queries if query.statistic == "histogram"]
        releases: list[tuple[list[float], float]] = []
        layout: list[tuple[str, float, float, int]] = []
        for column, (low, high) in rules.columns.items():
            values = _kept(self.data.columns[column], low, high)
            # privacy's rules bound every column (ravop/federated/column_rules.py)
            low, high = cast(float, low), cast(float, high)
            sum_sensitivity, squares_sensitivity = privacy.sensitivities(low, high)
            exact = [([float(values.size)], 1.0), ([float(values.sum())], sum_sensitivity),
                     ([float(np.square(values).sum())], squares_sensitivity)][:moments]
            for query in wanted_histograms:
                found, _ = np.histogram(values, histograms.edges(query, column, (low, high)))
                exact.append((found.astype(float).tolist(), 1.0))
            releases += exact
            layout.append((column, low, high, len(exact)))
        epsilon, delta = cast(tuple[float, float], rules.privacy)
        cast(PrivacyLedger, self.ledger).charge(epsilon, delta, graph)   # _check_privacy: a ledger is set
        noisy = iter(privacy.release(releases, epsilon, delta))
        partials: dict[str, dict[str, Any]] = {}
        for column, low, high, n in layout:
            mine = [next(noisy) for _ in range(n)]
            moment = [values[0] for values in mine[:moments]] + [np.nan] * (3 - moments)
            part = privacy.noisy_partial(*moment, low, high)   # type: ignore[call-arg]   # moment: 3 values
            if part["count"] < k:
                partials[column] = {"withheld": k}
                continue
            if wanted_histograms:
                part["histograms"] = {
                    query.histogram_key(): [None if 0 < c < k else c for c in (max(int(round(v)), 0) for v in counts)]
                    for query, counts in zip(wanted_histograms, mine[moments:])}
            partials[column] = part
        return partials

    def _start_secure(self, keys: GraphKeys, rules: Rules, queries: list[Query]) -> None:
        """Fix this provider's sums now (charging the ledger if private), publish its keys, and go on at polls."""
        ref = graph_ref(keys)
        residues, contribution = self.secure_sums(rules, queries, ref)
        self._pending[ref] = SecureRound(self.client, self.scripts, self.name, keys, rules, residues, contribution)
        self._step_secure(ref)

    def _step_secure(self, ref: str) -> None:
        rounds = self._pending[ref]
        try:
            if rounds.step():
                del self._pending[ref]
        except redis.RedisError:
            raise
        except Exception as exc:  # dropped below the threshold, a rewritten key or share: the graph fails
            del self._pending[ref]
            log.warning("provider %s: secure graph %s: %s", self.name, rounds.keys.graph_id, exc)
            self.graph_scripts.fail(rounds.keys, queue("cpu"), "", worker=self.name, reason="federated graph",
                                    error=f"{type(exc).__name__}: {exc}")

    def secure_sums(self, rules: Rules, queries: Sequence[Query], graph: str = ""
                    ) -> tuple[list[int], dict[str, Any]]:
        """(the residues of this provider's sums, its clear part: {"withheld": {column: k}, "k": k} and the
        vector's "layout", which stays here)."""
        k = max(self.min_group_size, rules.min_group_size)
        wanted_histograms = [query for query in queries if query.statistic == "histogram"]
        releases: list[tuple[list[float], Any]] = []   # a sensitivity is None for an open bound (no privacy)
        withheld: dict[str, int] = {}
        for column, (low, high) in rules.columns.items():
            values = _kept(self.data.columns[column], low, high)
            shifted = values - secure.centre(low, high)
            half = (high - low) / 2 if low is not None and high is not None else None
            releases += [([float(values.size)], 1.0), ([float(shifted.sum())], half),
                         ([float(np.square(shifted).sum())], half * half if half is not None else None)]
            releases += [(np.histogram(values, histograms.edges(query, column, (low, high)))[0].astype(float).tolist(),
                          1.0) for query in wanted_histograms]
        sums: Sequence[Sequence[float]]
        if rules.privacy is not None:
            epsilon, delta = rules.privacy
            cast(PrivacyLedger, self.ledger).charge(epsilon, delta, graph)   # _check_privacy: a ledger is set
            sums = privacy.release(releases, epsilon, delta)
        else:
            sums = [values for values, _ in releases]
        per_column = 3 + len(wanted_histograms)
        vector: list[float] = []
        for i, column in enumerate(rules.columns):
            mine = [v for values in sums[i * per_column:(i + 1) * per_column] for v in values]
            if mine[0] < k:   # under privacy, the noisy count decides: post-processing
                withheld[column] = k
                mine = [0.0] * len(mine)
            vector += mine
        layout = secure.kinds(len(rules.columns), [query.bins for query in wanted_histograms])
        return secure.encode(vector, layout), {"withheld": withheld, "k": k, "layout": layout}


def _kept(values: Any, low: Optional[float], high: Optional[float]) -> Any:
    """The values a rule keeps: not missing, within [low, high] (the `federated_partial` op's filter)."""
    keep = ~np.isnan(values)
    if low is not None:
        keep &= values >= low
    if high is not None:
        keep &= values <= high
    return values[keep]
