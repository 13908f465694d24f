"""A provider's rounds of one secure graph (`ravop.federated.recovery`), advanced at each poll: publish its keys;
once all `max_clients` are in, send its encrypted shares; once all shares are in, write its masked sums; once
the inputs close, reveal its shares (the t-th reveal ends the graph). The inputs close when every provider
wrote its sums, or when the ones that did not have stopped (their worker heartbeat expired: a killed or
disconnected process) and at least t wrote theirs: then a survivor closes them without the dropped (or fails
the graph naming them and t).
"""
import json
import logging
from typing import Any, Dict, List

from ravop.core import graph_states
from ravop.federated import recovery, secure
from ravop.federated.column_rules import Rules
from ravop.store import GraphKeys
from ravop.store.client_types import Client
from ravop.store.federated_schema import FederatedScripts, public_keys, shares_key
from ravop.store.keys import FederatedKeys, graph_ref, worker_key

log = logging.getLogger("ravop.worker")
KEYS, SHARES, INPUTS = "keys", "shares", "inputs"   # what the provider waits for


class DroppedBelowThreshold(ValueError):
    """Too many providers dropped out of a secure graph for the survivors' sum to be released."""


class SecureRound:
    def __init__(self, client: Client, scripts: FederatedScripts, name: str, keys: GraphKeys, rules: Rules,
                 residues: List[int], contribution: Dict[str, Any]) -> None:
        self.client, self.scripts, self.name, self.keys, self.rules = client, scripts, name, keys, rules
        self.residues, self.contribution = residues, contribution   # the contribution holds the layout
        self.context = graph_ref(keys)
        self.secrets = recovery.ProviderSecrets()
        self.publics: Dict[str, str] = {}
        self.waits_for = KEYS
        scripts.publish_key(keys, name, self.secrets.public())

    def step(self) -> bool:
        """Advance as far as the others allow; True once this provider has nothing more to send."""
        if self.client.hget(self.keys.meta, "state") != graph_states.RUNNING.encode():
            return True   # ended, failed or deleted
        n = self.rules.max_clients
        if self.waits_for == KEYS:
            self.publics = public_keys(self.client, self.keys)
            if len(self.publics) < n:
                return False
            if self.publics.get(self.name) != self.secrets.public():   # before a share is encrypted to a forgery
                raise secure.TamperedAggregate(f"the public key of provider {self.name} was rewritten after it "
                                               "registered: the store holds another than it published; the query "
                                               "is refused (docs/operators/security.md)")
            self.scripts.share(self.keys, self.name, self.secrets.shares(self.name, self.publics, self.context))
            self.waits_for = SHARES
        if self.waits_for == SHARES:
            if self.client.hlen(shares_key(self.keys)) < n:
                return False
            layout = self.contribution.pop("layout")
            masked = self.secrets.masked(self.residues, layout, self.name, self.publics, self.context)
            # the keys it published and masked with: a key rewritten in the store is named before any reveal
            sent = {**self.contribution, "secure": secure.pack(masked, layout),
                    "public": secure.key_digest(self.secrets.public()),
                    "keys": {name: secure.key_digest(public) for name, public in self.publics.items()},
                    "seed": recovery.commitment(self.secrets.seed, self.name, self.context)}
            if not self.scripts.contribute(self.keys, self.name, sent, secure=True):
                # too late: the inputs closed without it; no longer a survivor, it reveals nothing
                log.warning("provider %s: graph %s closed its inputs without it", self.name, self.keys.graph_id)
                return True
            log.info("provider %s: sent masked sums of %s to graph %s", self.name, self.rules.describe_columns(),
                     self.keys.graph_id)
            self.waits_for = INPUTS
        if self.client.hget(self.keys.meta, "inputs_closed") is None and not self._close_without_dropped():
            return False
        self._reveal()
        return True

    def _close_without_dropped(self) -> bool:
        """Close the inputs if the providers missing from them have stopped; True once they are closed."""
        clients = {name.decode(): state.decode()
                   for name, state in self.client.hgetall(FederatedKeys(self.keys).clients).items()}
        missing = sorted(name for name, state in clients.items() if state == "joined")
        if not missing or any(self.client.exists(worker_key(name)) for name in missing):
            return False   # all in (the last one closes them) or one still runs: wait for it
        t = recovery.threshold(self.rules.max_clients)
        outcome, inputs = self.scripts.close_inputs(self.keys, t, missing)
        if outcome == "short":
            raise DroppedBelowThreshold(
                f"provider(s) {', '.join(missing)} dropped out of secure graph {self.keys.graph_id} after the masks "
                f"were set up: {inputs} of {self.rules.max_clients} providers sent their sums, fewer than the "
                f"threshold t={t} (up to {self.rules.max_clients - t} may drop), so no sum is released")
        if outcome == "closed":
            log.info("provider %s: graph %s goes on without dropped provider(s) %s", self.name, self.keys.graph_id,
                     ", ".join(missing))
        return outcome == "closed"

    def _reveal(self) -> None:
        """Reveal this survivor's shares, once every survivor's contribution names the keys their owners
        published (a rewritten key refuses the reveal, so the masks it could undo stay on)."""
        fed = FederatedKeys(self.keys)
        partials = {name.decode(): json.loads(data) for name, data in self.client.hgetall(fed.partials).items()}
        secure.check_keys(partials)
        received = {name.decode(): json.loads(data)
                    for name, data in self.client.hgetall(shares_key(self.keys)).items()}
        revealed = self.secrets.reveal(self.name, self.publics, received, sorted(partials), self.context)
        if self.scripts.reveal(self.keys, self.name, revealed, recovery.threshold(self.rules.max_clients)):
            log.info("provider %s: revealed its shares of graph %s", self.name, self.keys.graph_id)
