"""A plan's persist names: the `persisted` map of names given one by one and the `persist_rules` of names a loop
step persists by rule (`ravop.core.persist_rules`), packed by the plan writer (compiler/plan.py) and read back
by the session at activation and by tests."""
from typing import Any

from ..core.persist_rules import PersistedIds, PersistRule


def add_rule(plan: Any, rule: PersistRule) -> None:
    """Append `rule` to `plan` (a plan_pb2.Plan)."""
    names = rule.names
    plan.persist_rules.add(template=names.template, first_epoch=names.epochs.start, epochs=len(names.epochs),
                           first_batch=names.batches.start, batches=len(names.batches), first_id=rule.first_id)


def persisted_ids(plan: Any) -> PersistedIds:
    """Every persist name of `plan` with its tensor id, the rules kept as rules."""
    rules = [PersistRule.of(r.template, r.first_epoch, r.epochs, r.first_batch, r.batches, r.first_id)
             for r in plan.persist_rules]
    return PersistedIds(dict(plan.persisted), rules)
