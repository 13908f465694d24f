"""A provider's privacy ledger: the epsilon budget its owner set (`ravop-worker --data f.csv --epsilon-budget 3`)
and what each private query spent of it, for one dataset (the data files, by absolute path).

It is a small JSON file beside the first data file (`<file>.privacy-ledger.json`), so it lives as long as the
data does, survives restarts and is found again by any worker given the same files; it is written atomically
(temporary file, fsync, rename) before the provider releases anything, so a crash can lose a release but never
its charge. A budget given again at start replaces the total; what was spent stays spent.
"""
import json
import os
import time
from pathlib import Path
from typing import Any, Iterable, Union

from ravop.federated.privacy import available


class BudgetExhausted(ValueError):
    """A private query asks more epsilon than the dataset has left."""


class PrivacyLedger:
    def __init__(self, path: Union[str, Path], dataset: Iterable[str], budget: float) -> None:
        if not budget > 0:
            raise ValueError(f"the epsilon budget must be > 0, not {budget}")
        if not available():
            raise ValueError("an epsilon budget needs OpenDP, which draws the noise: pip install "
                             "'ravop-engine[privacy]'")
        self.path, self.dataset, self.budget = Path(path), sorted(dataset), float(budget)
        self.queries: list[dict[str, Any]] = []
        if self.path.exists():
            try:
                saved = json.loads(self.path.read_text())
                self.queries = [dict(q) for q in saved["queries"]]
                float(sum(q["epsilon"] for q in self.queries))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{self.path}: not a privacy ledger ({type(exc).__name__}); it records what was "
                                 "spent of this data's budget, so it is not replaced: move it away to start over "
                                 "with a full budget") from None
        self._write()

    @classmethod
    def beside(cls, data_paths: Iterable[Union[str, Path]], budget: float) -> "PrivacyLedger":
        paths = [str(Path(p).resolve()) for p in data_paths]
        return cls(Path(paths[0]).with_name(Path(paths[0]).name + ".privacy-ledger.json"), paths, budget)

    @property
    def spent(self) -> float:
        return sum(q["epsilon"] for q in self.queries)

    @property
    def remaining(self) -> float:
        return max(self.budget - self.spent, 0.0)

    def check(self, epsilon: float) -> None:
        if epsilon > self.remaining + 1e-12:
            raise BudgetExhausted(f"the privacy budget of this provider's data is spent: the query asks epsilon "
                                  f"{epsilon:g} and {self.remaining:g} of {self.budget:g} remains")

    def charge(self, epsilon: float, delta: float, graph: str) -> None:
        """Record the query (refusing it if it does not fit), durably, before anything of it is released."""
        self.check(epsilon)
        self.queries.append({"graph": graph, "epsilon": epsilon, "delta": delta, "time": time.time()})
        self._write()

    def _write(self) -> None:
        state = {"dataset": self.dataset, "budget": self.budget, "spent": self.spent, "queries": self.queries}
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w") as f:
            json.dump(state, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
