"""A graph's persist names as the plan and the store hold them: the names given one by one, each with its tensor
id, and the names of a loop step's rules (`loss_names.RunNames`), each rule with the id of its first run, the k-th
name of the rule naming the value stored under id `first_id + k`. So a fit of 10**6 epochs activates, uploads and
is read back by its few rules, not by its 2 million names (issue 44). The compiler writes them into the plan
(`ravop.wire.persisted`), the store keeps each rule as one string (`encode` / `decode`), and a name is looked up
by matching it against each rule (`PersistedIds.get`)."""
import re
from collections.abc import Iterator, Mapping
from typing import Final, Optional, Union

from .loss_names import RunNames

# "first_id first_epoch epochs first_batch batches template": numbers first, so a Lua script parses it with one
# pattern whatever the template holds (ravop/store/loss_reads.py).
_ENCODED: Final = re.compile(r"(\d+) (\d+) (\d+) (\d+) (\d+) (.+)\Z", re.DOTALL)


class PersistRule:
    """`names[k]` persisted under tensor id `first_id + k`."""
    __slots__ = ("names", "first_id")

    def __init__(self, names: RunNames, first_id: int) -> None:
        if first_id < 0:
            raise ValueError(f"a persist rule's first tensor id counts from 0, not {first_id}")
        self.names, self.first_id = names, first_id

    def id_of(self, name: str) -> Optional[int]:
        """The tensor id of `name`, or None if the rule does not name it."""
        try:
            return self.first_id + self.names.index(name)
        except ValueError:
            return None

    @classmethod
    def of(cls, template: str, first_epoch: int, epochs: int, first_batch: int, batches: int,
           first_id: int) -> "PersistRule":
        """The rule of `template`'s names over `epochs` epochs from `first_epoch` and `batches` batches from
        `first_batch` (the fields the plan and the store keep)."""
        return cls(RunNames(template, range(first_epoch, first_epoch + epochs),
                            range(first_batch, first_batch + batches)), first_id)

    def encode(self) -> str:
        names = self.names
        return (f"{self.first_id} {names.epochs.start} {len(names.epochs)} {names.batches.start} "
                f"{len(names.batches)} {names.template}")

    @classmethod
    def decode(cls, data: Union[bytes, str]) -> "PersistRule":
        """The rule `encode` wrote; ValueError naming the text if it is not one (the store is not trusted)."""
        text = data.decode() if isinstance(data, bytes) else data
        match = _ENCODED.match(text)
        if match is None:
            raise ValueError(f"{text[:80]!r} is not a persist rule (first id, epochs, batches, template)")
        first_id, first_epoch, epochs, first_batch, batches = map(int, match.groups()[:5])
        return cls.of(match[6], first_epoch, epochs, first_batch, batches, first_id)


class PersistedIds(Mapping[str, int]):
    """persist name -> tensor id, of names given one by one (`listed`) and by rules; `get`, `in` and `len` cost
    one match per rule, iterating lists every name (a test's or in-process run's, not the session's)."""

    def __init__(self, listed: Mapping[str, int], rules: list[PersistRule]) -> None:
        self.listed, self.rules = dict(listed), list(rules)

    def __getitem__(self, name: str) -> int:
        node_id = self.listed.get(name)
        if node_id is None:
            node_id = next((i for i in (rule.id_of(name) for rule in self.rules) if i is not None), None)
        if node_id is None:
            raise KeyError(name)
        return node_id

    def __iter__(self) -> Iterator[str]:
        yield from self.listed
        for rule in self.rules:
            yield from rule.names

    def __len__(self) -> int:
        return len(self.listed) + sum(len(rule.names) for rule in self.rules)
