"""History: what `NeuralNetwork.fit` returns, as in Keras. `fit` only records the training, so the losses
are fetched lazily, the first time they are read once the graph has run, all in one round trip
(`R.fetch_losses`), and kept.

    history = model.fit(X, y, n_epochs=10, batch_size=32)
    R.activate(); R.execute(); R.track_progress()
    history.history['loss']      # mean training loss per epoch (and 'val_loss' with validation_data)
    history.batch_losses         # numpy array, one loss per step
    history.plot()               # matplotlib (pip install 'ravop-engine[plot]')

It is also the sequence of the training loss names in order, as `fit` returned before it returned a History (by
rule, `ravop.core.loss_names.RunNames`, for a fit without a strategy: O(1) in the epochs, not a list).
"""
import html
from collections.abc import Sequence
from typing import Any, Optional, Union, cast, overload

import ravop as R
from ravop.client.placement import contributions, held_by
from ravop.client.training_losses import Losses
from ravop.core import graph_states
from ravop.core.errors import GraphFailedError, NotComputedError

from .notebook import html_table


class History(Sequence[str]):
    def __init__(self, loss_names: Sequence[str], graph: R.Graph, epochs: int, validation: bool) -> None:
        self.names = loss_names   # kept as given: a rule stays a rule
        self.graph = graph
        self.epochs_run = epochs   # counted, not listed, until `epoch` is read
        self.params = {"epochs": epochs, "steps": len(loss_names), "validation": validation}
        self._losses: Optional[Losses] = None
        self.stopped_after: Optional[int] = None   # the epochs run when a stop request ended the training early
        self.stop_reason: Optional[str] = None

    @property
    def epoch(self) -> list[int]:
        """As Keras: the indices of the epochs run, from 0."""
        return list(range(self.epochs_run))

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, k: int) -> str: ...

    @overload
    def __getitem__(self, k: slice) -> Sequence[str]: ...

    def __getitem__(self, k: Union[int, slice]) -> Union[str, Sequence[str]]:
        return self.names[k]

    def stopped(self, epochs: int, reason: str) -> None:
        """A stop request ended the training after `epochs` epochs: the history ends there."""
        self.stopped_after, self.stop_reason = epochs, reason
        self.epochs_run = epochs

    def _fetched(self) -> Losses:
        if self._losses is None:
            if not self.graph.activated:
                raise NotComputedError(f"graph {self.graph.name!r} has not run: R.activate(), R.execute() and "
                                       "R.track_progress() first")
            losses = R.fetch_losses(self.graph)
            if losses.state in graph_states.UNFINISHED:
                raise GraphFailedError(f"graph {self.graph.name!r} is {losses.state}, so its losses are incomplete: "
                                       "R.track_progress() or `ravop logs` say why")
            if losses.state != graph_states.DONE:
                raise NotComputedError(f"graph {self.graph.name!r} is {losses.state}: the history is read once "
                                       "it has run (R.track_progress() waits for it; R.fetch_losses() reads the "
                                       "losses computed so far)")
            if losses.stopped_step is not None:
                epochs = losses.stopped_step // (len(self) // self.params["epochs"])
                if self.stopped_after is None:   # no callback of this process asked: `ravop stop`, or another
                    self.stopped(epochs, "a stop was requested")
                losses = _truncated(losses, epochs, losses.stopped_step)
            self._losses = losses
        return self._losses

    @property
    def placement(self) -> dict[str, dict[str, list[str]]]:
        """{strategy: {role ('replica r'): [workers]}}: the workers that ran each replica of the graph's fits under
        a strategy, from the engine's records (ravop.client.placement.held_by), not the activation's forecast."""
        return held_by(self.graph)

    @property
    def contributions(self) -> dict[str, dict[str, dict[str, Any]]]:
        """{strategy: {role ('replica r'): {"workers", "steps_per_round", "samples_per_round", "rounds",
        "steps_done", "samples_done", "rounds_without"}}}: the workers that ran each replica of the graph's fits on
        shards over time (a takeover, or a provider that joined and took a waiting replica, names one more), what
        it contributes per round and has done so far, and the rounds that closed without it (DiLoCo's
        `close_after`; ravop.client.placement.contributions)."""
        return contributions(self.graph)

    @property
    def batch_losses(self) -> Any:
        """One training loss per step, in order (numpy array)."""
        return self._fetched().batch

    @property
    def history(self) -> dict[str, list[float]]:
        """{'loss': mean training loss per epoch, 'val_loss': validation loss per epoch (with
        validation_data)}, as lists of floats."""
        losses = self._fetched()
        result = {"loss": losses.per_epoch().tolist()}
        if self.params["validation"]:
            result["val_loss"] = losses.validation.tolist()
        return result

    def _repr_html_(self) -> str:
        """In a notebook: the losses per epoch once the graph has run, else what the fit recorded."""
        try:
            history = self.history
        except (NotComputedError, GraphFailedError) as exc:
            return f"<p>History of {len(self):,} steps over {self.params['epochs']} epochs: {html.escape(str(exc))}</p>"
        columns = ["loss"] + (["val_loss"] if "val_loss" in history else [])
        rows = [[e + 1] + [f"{history[c][e]:.6g}" for c in columns] for e in self.epoch]
        caption = f"graph {self.graph.name!r}, {len(self):,} steps"
        if self.stopped_after is not None:
            caption += f"; {self.stop_reason}"
        return html_table(["epoch"] + columns, rows, caption)

    def plot(self, ax: Any = None) -> Any:
        """Plot the batch losses, the epoch means and the validation losses against epochs; returns the
        matplotlib Axes (a new figure's unless `ax` is given)."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("History.plot needs matplotlib: pip install 'ravop-engine[plot]'") from None
        losses = self._fetched()
        if ax is None:
            ax = plt.figure().gca()
        steps_per_epoch = len(losses.batch) / max(self.epochs_run, 1)
        ax.plot([(i + 1) / steps_per_epoch for i in range(len(losses.batch))], losses.batch, lw=0.8, alpha=0.5,
                label="batch loss")
        epochs = [e + 1 for e in self.epoch]
        ax.plot(epochs, self.history["loss"], marker="o", label="loss")
        if self.params["validation"]:
            ax.plot(epochs, losses.validation, marker="s", label="val_loss")
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss")
        ax.legend()
        return ax


def _truncated(losses: Losses, epochs: int, steps: int) -> Losses:
    """The losses of the first `steps` steps and `epochs` epochs (a training a stop request ended)."""
    return Losses(losses.graph_id, losses.state, losses.batch[:steps], losses.epoch[:steps],
                  losses.validation[:epochs], losses.stopped_step, cast(Any, losses.batch_stored)[:steps],
                  cast(Any, losses.validation_stored)[:epochs])   # fetch_losses sets both
