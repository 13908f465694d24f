"""What a graph's loop steps persist: persist name -> the step's Op, each step output's names kept as given, a
list or a rule (`ravop.core.loss_names.RunNames`), so looking a name up costs O(1) per output and a fit of 10**6
epochs holds no list of its names. Iterating lists every name (in-process evaluation does)."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..core.loss_names import RunNames


class StepOutputs(Mapping[str, Any]):
    def __init__(self) -> None:
        self._listed: dict[str, Any] = {}              # names given as a list -> Op
        self._rules: list[tuple[RunNames, Any]] = []   # (rule, Op)

    def add(self, names: Sequence[str], op: Any) -> None:
        """`op` persisted as each of `names` (checked unused by the graph first: `Graph.check_persist_names`)."""
        if isinstance(names, RunNames):
            self._rules.append((names, op))
        else:
            self._listed.update(dict.fromkeys(names, op))

    def copy(self) -> StepOutputs:
        """Another StepOutputs holding the same names, which later additions to either do not change."""
        other = StepOutputs()
        other._listed, other._rules = dict(self._listed), list(self._rules)
        return other

    def listed(self) -> list[str]:
        """The names given one by one."""
        return list(self._listed)

    def rules(self) -> list[RunNames]:
        return [rule for rule, _ in self._rules]

    def ops(self) -> list[Any]:
        """Each persisted Op once (not once per name)."""
        return list({id(op): op for op in [*self._listed.values(), *(op for _, op in self._rules)]}.values())

    def __getitem__(self, name: str) -> Any:
        op = self._listed.get(name)
        if op is not None:
            return op
        for rule, op in self._rules:
            if name in rule:
                return op
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return name in self._listed or any(name in rule for rule, _ in self._rules)

    def __iter__(self) -> Iterator[str]:
        yield from self._listed
        for rule, _ in self._rules:
            yield from rule

    def __len__(self) -> int:
        return len(self._listed) + sum(len(rule) for rule, _ in self._rules)

    def __bool__(self) -> bool:   # without counting the names
        return bool(self._listed or self._rules)
