"""Keras-style callbacks for `fit(..., callbacks=[...])`: `Callback` to subclass, and built in `TensorBoard`,
`CSVLogger`, `EarlyStopping`, `TerminateOnNaN`, `MLflow` and `WandB`.

`fit` only records the training; the loop runs on a worker once the graph is executed. The callbacks fire in
the requester's process while `R.track_progress()` (or `R.execute(timeout=...)`) follows the graph: about once a
second it reads the losses the worker has persisted so far (one round trip, `R.fetch_losses`) and feeds the new
ones to the callbacks in order. Training never waits for them; their events lag the worker by the loop's flush
interval and the poll (a second or two), and arrive in bursts. The same watcher warns (ravdl.v2.nonfinite) of
the first NaN or infinite loss, callbacks or not (without callbacks it reads the losses every 10 s).

    on_train_begin(logs)          the first time the tracker sees the graph running
    on_batch_end(batch, logs)     per training step: batch index in its epoch (from 0); logs {'loss', 'step'}
    on_epoch_end(epoch, logs)     once an epoch's steps (and validation) are all persisted: epoch from 0;
                                  logs {'loss': mean batch loss, 'val_loss' with validation_data}
    on_train_end(logs)            when the graph has ended; logs {'state', 'stopped_after' (epochs run when a stop
                                  ended the training early, else None)}

EarlyStopping and TerminateOnNaN (in a fit without a strategy) are decided in the loop itself, at the end of each
epoch (ravdl.v2.loop_stopping): the loop ends at the epoch that decides, whatever the epoch rate. Any other callback
stops the training by setting `self.model.stop_training = True` (as in Keras; set `stop_reason` on itself to say
why): the requester asks the graph to stop (`ravop.tools.status.request_stop`), and the worker ends the loop at its
next epoch boundary, as if the fit had been recorded with that many epochs: the model's parameters
and optimizer state are those of that epoch, bit for bit, what was recorded after `fit` (predictions,
`save_model`) is computed from them, and the graph ends done. The worker learns of the request within about a
second and may have run later epochs by then (hundreds on a fast model): the training ends at the boundary it
reaches next, so `History` (and the callbacks' events) may hold those epochs after the one the callback stopped
at, all of them trained.
A training that ends before the request lands keeps every epoch. Loops that run in segments or exchange values
with other loops (the parallel strategies) do not stop early: they train to the end.
"""
import csv
import math
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union, cast

from ravop.client import fetching, training_losses, watching
from ravop.core import graph_states
from ravop.tools import status

from . import nonfinite

if TYPE_CHECKING:
    from ravop.store.keys import GraphKeys

    from .history import History

POLL_SECONDS = 1.0   # how often the losses are read while the graph trains (the loop flushes about this often)
# A fit without callbacks is watched only for non-finite losses: its losses (all of them, one round trip that
# grows with the steps) are read this much less often.
QUIET_POLL_SECONDS = 10.0


class Callback:
    """Base class: override the events you need. `self.model` is the model being fitted, `self.params` the fit's
    {'epochs', 'steps' (per epoch), 'validation'}."""

    model: Any = None                      # the model being fitted (it has `stop_training`)
    params: Any = None                     # {'epochs', 'steps', 'validation'}
    stop_reason: Optional[str] = None

    def set_model(self, model: Any) -> None:
        self.model = model

    def set_params(self, params: dict[str, Any]) -> None:
        self.params = params

    def check(self, validation: bool) -> None:
        """Refuse, before the fit is recorded, a fit this callback cannot follow (`validation`: whether it
        persists validation losses)."""

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        pass

    def on_batch_end(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        pass

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        pass

    def on_train_end(self, logs: Optional[dict[str, Any]] = None) -> None:
        pass


def _missing_extra(what: str, extra: str, module: str) -> ImportError:
    return ImportError(f"{what} needs {module}: pip install 'ravop-engine[{extra}]'")


class TensorBoard(Callback):
    """Writes scalars for TensorBoard with torch.utils.tensorboard: `batch/loss` per training step (its global
    step, from 1) and `epoch/loss`, `epoch/val_loss` per epoch (from 1), under `log_dir`. Needs
    `pip install 'ravop-engine[tensorboard]'`."""

    def __init__(self, log_dir: Union[str, "os.PathLike[str]"] = "runs") -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _missing_extra("the TensorBoard callback", "tensorboard", "tensorboard") from None
        self.log_dir = os.fspath(log_dir)
        self._writer_class = SummaryWriter
        self.writer: Any = None

    def on_train_begin(self, logs: Any = None) -> None:
        self.writer = self._writer_class(log_dir=self.log_dir)

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.writer.add_scalar("batch/loss", logs["loss"], logs["step"])

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        for name, value in logs.items():
            self.writer.add_scalar(f"epoch/{name}", value, epoch + 1)
        self.writer.flush()

    def on_train_end(self, logs: Any = None) -> None:
        if self.writer is not None:
            self.writer.close()


class CSVLogger(Callback):
    """One row per epoch in `filename`: `epoch` (from 0, as Keras), `loss` and `val_loss` (with validation_data);
    `append=True` adds to an existing file instead of replacing it."""

    def __init__(self, filename: Union[str, "os.PathLike[str]"], separator: str = ",", append: bool = False) -> None:
        self.filename, self.separator, self.append = os.fspath(filename), separator, append
        self._file: Any = None
        self._writer: Any = None

    def on_train_begin(self, logs: Any = None) -> None:
        exists = self.append and os.path.exists(self.filename) and os.path.getsize(self.filename) > 0
        self._file = open(self.filename, "a" if self.append else "w", newline="")
        fields = ["epoch", "loss"] + (["val_loss"] if self.params["validation"] else [])
        self._writer = csv.DictWriter(self._file, fields, delimiter=self.separator)
        if not exists:
            self._writer.writeheader()
        self._file.flush()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._writer.writerow({"epoch": epoch, **logs})
        self._file.flush()

    def on_train_end(self, logs: Any = None) -> None:
        if self._file is not None:
            self._file.close()


class EarlyStopping(Callback):
    """Stop the training when `monitor` ('val_loss' or 'loss') has not improved by more than `min_delta` for
    `patience` epochs (`mode` 'min', 'max' or 'auto': min for a loss). The model keeps the parameters of the
    epoch where the loop stopped; Keras's `restore_best_weights` is refused. In a fit without a strategy the
    decision is made in the loop itself, at the end of the epoch that decides (ravdl.v2.loop_stopping): the loop
    ends there whatever the epoch rate; under a strategy, as the other callbacks (the module's docstring)."""

    def __init__(self, monitor: str = "val_loss", patience: int = 0, min_delta: float = 0.0, mode: str = "auto",
                 restore_best_weights: bool = False) -> None:
        if monitor not in ("loss", "val_loss"):
            raise ValueError(f"EarlyStopping monitors 'loss' or 'val_loss' (what fit persists), not {monitor!r}")
        if int(patience) < 0:
            raise ValueError(f"patience must be >= 0, not {patience}")
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"mode must be 'auto', 'min' or 'max', not {mode!r}")
        if restore_best_weights:
            raise NotImplementedError("EarlyStopping(restore_best_weights=True) is not implemented: the loop keeps "
                                      "no copy of an earlier epoch's parameters; the model keeps those of the epoch "
                                      "where it stopped (fit with n_epochs=best epoch to get the best one's)")
        self.monitor, self.patience, self.min_delta = monitor, int(patience), abs(float(min_delta))
        self.sign = -1.0 if mode == "max" else 1.0
        self.best_epoch: Optional[int] = None
        self.stopped_epoch: Optional[int] = None
        self.best, self.wait = math.inf, 0
        self.in_loop = False   # recorded into the fit's loop, which ends itself (ravdl.v2.loop_stopping)

    def check(self, validation: bool) -> None:
        self.in_loop = False   # until this fit records it into its loop (not under a strategy)
        if self.monitor == "val_loss" and not validation:
            raise ValueError("EarlyStopping(monitor='val_loss') needs validation losses: give the model "
                             "validation_data, or monitor='loss'")

    def on_train_begin(self, logs: Any = None) -> None:
        self.best, self.best_epoch, self.wait, self.stopped_epoch = math.inf, None, 0, None

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.stopped_epoch is not None:
            return   # the stop is asked for; the epochs the loop runs meanwhile change nothing
        current = self.sign * logs[self.monitor]
        if current < self.best - self.min_delta:
            self.best, self.best_epoch, self.wait = current, epoch, 0
            return
        self.wait += 1
        if self.wait > self.patience:
            self.stopped_epoch = epoch
            # no best epoch when no value was finite (NaN from the start): there is nothing to name
            best = ("no finite value" if self.best_epoch is None
                    else f"best {self.sign * self.best:.6g} after epoch {self.best_epoch + 1}")
            self.stop_reason = f"EarlyStopping: {self.monitor} did not improve for {self.wait} epochs ({best})"
            if not self.in_loop:   # the loop has already ended there itself
                self.model.stop_training = True


class TerminateOnNaN(Callback):
    """Stop the training at the first NaN or infinite training loss (as Keras's): the loop ends at the end of that
    epoch (decided in the loop without a strategy, ravdl.v2.loop_stopping; else by request, the module's
    docstring), with the parameters it has then, which may be NaN already."""

    in_loop = False   # recorded into the fit's loop, which ends itself (ravdl.v2.loop_stopping)

    def check(self, validation: bool) -> None:
        self.in_loop = False   # until this fit records it into its loop (not under a strategy)

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.stop_reason is None and not math.isfinite(logs["loss"]):
            self.stop_reason = f"TerminateOnNaN: training loss {logs['loss']} at step {logs['step']}"
            if not self.in_loop:   # the loop ends at this epoch's end itself
                self.model.stop_training = True


class MLflow(Callback):
    """Logs `loss` per step and `loss`/`val_loss` per epoch to MLflow, in a run it starts (`run_name`) in
    `experiment` at `tracking_uri` (default: MLflow's, `$MLFLOW_TRACKING_URI` or ./mlruns), with `params`.
    Needs `pip install 'ravop-engine[mlflow]'`."""

    def __init__(self, experiment: Optional[str] = None, run_name: Optional[str] = None,
                 tracking_uri: Optional[str] = None, params: Optional[dict[str, Any]] = None) -> None:
        try:
            import mlflow
        except ImportError:
            raise _missing_extra("the MLflow callback", "mlflow", "mlflow") from None
        self.mlflow = mlflow
        self.experiment, self.run_name, self.tracking_uri = experiment, run_name, tracking_uri
        self.run_params = dict(params or {})
        self.run: Any = None

    def on_train_begin(self, logs: Any = None) -> None:
        if self.tracking_uri is not None:
            self.mlflow.set_tracking_uri(self.tracking_uri)
        if self.experiment is not None:
            self.mlflow.set_experiment(self.experiment)
        self.run = self.mlflow.start_run(run_name=self.run_name)
        self.mlflow.log_params({**self.params, **self.run_params})

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.mlflow.log_metric("batch_loss", logs["loss"], step=logs["step"])

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.mlflow.log_metrics(logs, step=epoch + 1)

    def on_train_end(self, logs: Any = None) -> None:
        if self.run is not None:
            self.mlflow.end_run(status="FINISHED" if logs["state"] == graph_states.DONE else "KILLED")


class WandB(Callback):
    """Logs `batch_loss` per step and `loss`/`val_loss` per epoch to Weights & Biases, in a run `wandb.init(project,
    name=name, config=config, **init_kwargs)` starts. Needs `pip install 'ravop-engine[wandb]'`."""

    def __init__(self, project: Optional[str] = None, name: Optional[str] = None,
                 config: Optional[dict[str, Any]] = None, **init_kwargs: Any) -> None:
        try:
            import wandb
        except ImportError:
            raise _missing_extra("the WandB callback", "wandb", "wandb") from None
        self.wandb = wandb
        self.init_kwargs = {"project": project, "name": name, "config": config, **init_kwargs}
        self.run: Any = None

    def on_train_begin(self, logs: Any = None) -> None:
        self.run = self.wandb.init(**self.init_kwargs)

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.run.log({"batch_loss": logs["loss"], "step": logs["step"]})

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.run.log({**logs, "epoch": epoch + 1})

    def on_train_end(self, logs: Any = None) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if logs["state"] == graph_states.DONE else 1)


class FitFollower:
    """The watcher (`ravop.client.watching`) of one fit: reads the persisted losses as the graph trains, turns them into
    callback events, warns of the first non-finite loss, and asks the graph to stop when a callback wants to."""

    def __init__(self, callbacks: list[Callback], model: Any, history: "History", clock: Callable[[], float]) -> None:
        self.callbacks, self.model, self.history, self.clock = callbacks, model, history, clock
        epochs, steps = history.params["epochs"], history.params["steps"]
        self.per_epoch = steps // epochs
        params = {"epochs": epochs, "steps": self.per_epoch, "validation": history.params["validation"]}
        model.stop_training = False
        for callback in callbacks:
            callback.set_model(model)
            callback.set_params(params)
        self.started = self.stop_asked = self.warned = False
        self.steps_seen = self.epochs_seen = 0
        self.every = POLL_SECONDS if callbacks else QUIET_POLL_SECONDS
        # without callbacks, no read as the graph starts (it has no loss yet, and a worker is starting its loop on
        # the same server): the first one after `every`, or at the end
        self.next_read = 0.0 if callbacks else clock() + self.every
        self.stopped_step: Optional[int] = None   # where a stop ended the loop, once the graph is done

    def poll(self, client: Any, keys: "GraphKeys", state: str) -> None:
        if state != graph_states.RUNNING:
            return
        now = self.clock()
        if now < self.next_read:
            return
        self.next_read = now + self.every
        self._feed(client, keys)

    def ended(self, client: Any, keys: "GraphKeys", state: str) -> None:
        if state == graph_states.DONE:
            self._feed(client, keys, done=True)
        if not self.started:
            self._begin()
        if self.stopped_step is not None:   # why: the graph's record (a callback's reason, `ravop stop --reason`)
            why = (client.hget(keys.meta, "stop") or client.hget(keys.meta, "stopped") or b"a stop was requested"
                   ).decode(errors="replace")   # "stopped": the loop's own decision (ravdl.v2.loop_stopping)
            self.history.stopped(self.stopped_step // self.per_epoch, why)
        logs = {"state": state, "stopped_after": self.history.stopped_after}
        for callback in self.callbacks:
            callback.on_train_end(logs)

    def _begin(self) -> None:
        self.started = True
        for callback in self.callbacks:
            callback.on_train_begin({})

    def _feed(self, client: Any, keys: "GraphKeys", done: bool = False) -> None:
        if not self.started:
            self._begin()
        # once done, read with the small values the user's fetches of the losses by name then take from memory
        losses = fetching.done_losses(keys) if done else training_losses.read(client, keys, padded=False)
        self.stopped_step = losses.stopped_step
        batch, missing = losses.batch, ~cast(Any, losses.batch_stored)   # both readers set it
        computed = int(missing.argmax()) if missing.any() else len(batch)   # the loop persists them in order
        validation = self.history.params["validation"]
        while self.epochs_seen < self.history.params["epochs"]:
            epoch = self.epochs_seen
            end = (epoch + 1) * self.per_epoch
            for step in range(self.steps_seen, min(end, computed)):
                self._batch_end(client, keys, step - epoch * self.per_epoch, float(batch[step]), step + 1, epoch)
            if computed < end or (validation and (len(losses.validation) <= epoch
                                                  or not cast(Any, losses.validation_stored)[epoch])):
                return
            logs = {"loss": float(batch[epoch * self.per_epoch:end].mean())}
            if validation:
                logs["val_loss"] = float(losses.validation[epoch])
            for callback in self.callbacks:
                callback.on_epoch_end(epoch, logs)
            self.epochs_seen = epoch + 1
            self._stop_if_asked(client, keys)

    def _batch_end(self, client: Any, keys: "GraphKeys", batch: int, loss: float, step: int, epoch: int) -> None:
        if not self.warned and not math.isfinite(loss):
            self.warned = True
            nonfinite.warn_loss(loss, epoch, batch, step)
        for callback in self.callbacks:
            callback.on_batch_end(batch, {"loss": loss, "step": step})
        self.steps_seen = step
        self._stop_if_asked(client, keys)

    def _stop_if_asked(self, client: Any, keys: "GraphKeys") -> None:
        if self.model.stop_training and not self.stop_asked:
            why = next((c.stop_reason for c in self.callbacks if c.stop_reason), "a callback set stop_training")
            self.stop_asked = True
            status.request_stop(client, keys, why, "a fit callback")
            # a graph that ended before the request landed trained to the end: History has every epoch

def checked(callbacks: Optional[Iterable[Callback]], validation: bool) -> list[Callback]:
    """The callbacks of a fit as a list, refused before anything is recorded if one cannot follow it."""
    callbacks = list(callbacks or ())
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise TypeError(f"callbacks take ravdl.v2.callbacks.Callback instances, not {type(callback).__name__}")
        callback.check(validation)
    return callbacks


def follow(callbacks: list[Callback], model: Any, history: "History") -> None:
    """Register the watcher of a fit that returned `history`, feeding its (checked) callbacks and warning of
    non-finite losses while the graph is tracked."""
    watching.watch(history.graph.id, FitFollower(callbacks, model, history, time.monotonic))
