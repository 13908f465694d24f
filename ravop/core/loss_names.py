"""The names training losses are persisted under, spelled once: `fit` persists one per training step as
`training_loss_epoch_{e}_batch_{b}` and, with validation data, `validation_loss_epoch_{e}` (both 1-based); a
hand-written loop may persist `training_loss_step_{s}`. `R.fetch_losses`, History and the dashboard read them back."""
import re
from collections.abc import Iterator, Sequence
from string import Formatter
from typing import Any, Final, Optional, Union, overload

TRAINING_PREFIX: Final = "training_loss_"     # every training loss name starts so (a Lua script filters by it)
VALIDATION_PREFIX: Final = "validation_loss_"
TRAINING_BATCH: Final = re.compile(r"training_loss_epoch_(\d+)_batch_(\d+)\Z")
TRAINING_STEP: Final = re.compile(r"training_loss_step_(\d+)\Z")
VALIDATION: Final = re.compile(r"validation_loss_epoch_(\d+)\Z")


def training_loss_name(epoch: int, batch: int) -> str:
    """The loss of batch `batch` of epoch `epoch`, both 1-based."""
    return f"training_loss_epoch_{epoch}_batch_{batch}"


def validation_loss_name(epoch: int) -> str:
    """The validation loss after epoch `epoch` (1-based)."""
    return f"validation_loss_epoch_{epoch}"


TRAINING_BATCH_RULE: Final = "training_loss_epoch_{e}_batch_{b}"   # the rules (RunNames) of the names above
VALIDATION_RULE: Final = "validation_loss_epoch_{e}"
STEP_RULE: Final = "training_loss_step_{e}"


def step_loss_name(step: int) -> str:
    """The loss of training step `step` (1-based) of a hand-written loop."""
    return f"training_loss_step_{step}"


class RunNames(Sequence[str]):
    """The names a loop step persists a value under, names[k] at its k-th run, by rule rather than listed, so a
    fit of 10**6 epochs records in constant memory: `template.format(e=e, b=b)` for e in `epochs`, b in `batches`
    (epoch-major; "training_loss_epoch_{e}_batch_{b}", "validation_loss_epoch_{e}", "training_loss_step_{e}").
    Indexing, `len`, `in` and `index` cost O(1); iterating lists them (the plan does, at activation)."""
    __slots__ = ("template", "epochs", "batches", "_pattern")

    def __init__(self, template: str, epochs: range, batches: range = range(1, 2)) -> None:
        fields = [name for _, name, _, _ in Formatter().parse(template) if name is not None]
        if sorted(fields) not in (["e"], ["b", "e"]) or (len(batches) > 1 and "b" not in fields):
            raise ValueError(f"a run names template holds {{e}} once and {{b}} at most once (needed for several "
                             f"batches), not {template!r}")
        if epochs.step != 1 or batches.step != 1 or min(epochs.start, batches.start) < 1:
            raise ValueError(f"a run names rule takes contiguous 1-based ranges, not {epochs} and {batches}")
        self.template, self.epochs, self.batches = template, epochs, batches
        number = {"e": "(?P<e>[1-9][0-9]*)", "b": "(?P<b>[1-9][0-9]*)"}
        self._pattern = re.compile("".join(re.escape(text) + (number[name] if name else "")
                                           for text, name, _, _ in Formatter().parse(template)) + r"\Z")

    def __len__(self) -> int:
        return len(self.epochs) * len(self.batches)

    @overload
    def __getitem__(self, k: int) -> str: ...

    @overload
    def __getitem__(self, k: slice) -> list[str]: ...

    def __getitem__(self, k: Union[int, slice]) -> Union[str, list[str]]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        k = range(len(self))[k]   # IndexError past the end, as a list's
        return self.template.format(e=self.epochs[k // len(self.batches)], b=self.batches[k % len(self.batches)])

    def __iter__(self) -> Iterator[str]:   # not by index: the plan lists every name at activation
        template = self.template
        for epoch in self.epochs:
            for batch in self.batches:
                yield template.format(e=epoch, b=batch)

    def index(self, name: Any, start: int = 0, stop: Optional[int] = None) -> int:
        """The run whose name is `name` (ValueError if none, as list.index), from the name's numbers."""
        match = self._pattern.match(name) if isinstance(name, str) else None
        epoch = int(match["e"]) if match else 0
        batch = int(match["b"]) if match and "b" in match.groupdict() else self.batches.start
        if not match or epoch not in self.epochs or batch not in self.batches:
            raise ValueError(f"{name!r} is not named by {self!r}")
        k = self.epochs.index(epoch) * len(self.batches) + self.batches.index(batch)
        if not start <= k < (len(self) if stop is None else stop):
            raise ValueError(f"{name!r} is not named by {self!r} in runs {start}..{stop}")
        return k

    def __contains__(self, name: object) -> bool:
        try:
            self.index(name)
        except ValueError:
            return False
        return True

    def overlaps(self, other: "RunNames") -> bool:
        """Whether a name is in both rules: of one template with ranges that meet, or whose ends the other holds
        (two templates' names only meet where one's numbers spell the other's text)."""
        if self.template == other.template:
            return _meet(self.epochs, other.epochs) and _meet(self.batches, other.batches)
        return any(name in other for name in (self[0], self[-1])) or any(name in self for name in (other[0], other[-1]))

    def __repr__(self) -> str:
        return f"RunNames({self.template!r}, {self.epochs}, {self.batches})"


def _meet(a: range, b: range) -> bool:
    return max(a.start, b.start) < min(a.stop, b.stop)
