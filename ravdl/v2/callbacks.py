"""Keras-style callbacks for `fit(..., callbacks=[...])`: `Callback` to subclass, and built in `TensorBoard`,
`CSVLogger`, `EarlyStopping`, `MLflow` and `WandB`.

`fit` only records the training; the loop runs on a worker once the graph is executed. The callbacks fire in
the requester's process while `R.track_progress()` (or `R.execute(timeout=...)`) follows the graph: about once a
second it reads the losses the worker has persisted so far (one round trip, `R.fetch_losses`) and feeds the new
ones to the callbacks in order. Training never waits for them; their events lag the worker by the loop's flush
interval and the poll (a second or two), and arrive in bursts.

    on_train_begin(logs)          the first time the tracker sees the graph running
    on_batch_end(batch, logs)     per training step: batch index in its epoch (from 0); logs {'loss', 'step'}
    on_epoch_end(epoch, logs)     once an epoch's steps (and validation) are all persisted: epoch from 0;
                                  logs {'loss': mean batch loss, 'val_loss' with validation_data}
    on_train_end(logs)            when the graph is done, failed or stopped; logs {'state', 'stopped_after' (epochs run
                                  before a stop, else None)}

A callback stops the training by setting `self.model.stop_training = True` in `on_epoch_end` (as in Keras; set
`stop_reason` on itself to say why): the graph is cancelled through the same path as `ravop cancel`. The worker
notices at its next flush (within about a second), so it may have run into a later epoch by then; no event after
the stopping epoch reaches the callbacks, `History` reports the epochs up to it, and `R.track_progress()`
returns (a graph that had already finished when the stop landed keeps every epoch). What the user does NOT get:
the trained parameters. A loop's outputs are stored only when it finishes, so after a stop the graph is failed
("stopped early ..."), and what was recorded after `fit` (predictions, `save_model`) is not computed: fetching it
raises GraphFailedError naming the stop.
"""
import csv
import math
import os
import time

import numpy as np

from ravop import graph_states, status, training_losses, watching

POLL_SECONDS = 1.0   # how often the losses are read while the graph trains (the loop flushes about this often)


class Callback:
    """Base class: override the events you need. `self.model` is the model being fitted, `self.params` the fit's
    {'epochs', 'steps' (per epoch), 'validation'}."""

    model = None
    params = None
    stop_reason = None

    def set_model(self, model):
        self.model = model

    def set_params(self, params):
        self.params = params

    def check(self, validation):
        """Refuse, before the fit is recorded, a fit this callback cannot follow (`validation`: whether it
        persists validation losses)."""

    def on_train_begin(self, logs=None):
        pass

    def on_batch_end(self, batch, logs=None):
        pass

    def on_epoch_end(self, epoch, logs=None):
        pass

    def on_train_end(self, logs=None):
        pass


def _missing_extra(what, extra, module):
    return ImportError(f"{what} needs {module}: pip install 'ravop-engine[{extra}]'")


class TensorBoard(Callback):
    """Writes scalars for TensorBoard with torch.utils.tensorboard: `batch/loss` per training step (its global
    step, from 1) and `epoch/loss`, `epoch/val_loss` per epoch (from 1), under `log_dir`. Needs
    `pip install 'ravop-engine[tensorboard]'`."""

    def __init__(self, log_dir="runs"):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _missing_extra("the TensorBoard callback", "tensorboard", "tensorboard") from None
        self.log_dir = os.fspath(log_dir)
        self._writer_class = SummaryWriter
        self.writer = None

    def on_train_begin(self, logs=None):
        self.writer = self._writer_class(log_dir=self.log_dir)

    def on_batch_end(self, batch, logs=None):
        self.writer.add_scalar("batch/loss", logs["loss"], logs["step"])

    def on_epoch_end(self, epoch, logs=None):
        for name, value in logs.items():
            self.writer.add_scalar(f"epoch/{name}", value, epoch + 1)
        self.writer.flush()

    def on_train_end(self, logs=None):
        if self.writer is not None:
            self.writer.close()


class CSVLogger(Callback):
    """One row per epoch in `filename`: `epoch` (from 0, as Keras), `loss` and `val_loss` (with validation_data);
    `append=True` adds to an existing file instead of replacing it."""

    def __init__(self, filename, separator=",", append=False):
        self.filename, self.separator, self.append = os.fspath(filename), separator, append
        self._file = self._writer = None

    def on_train_begin(self, logs=None):
        exists = self.append and os.path.exists(self.filename) and os.path.getsize(self.filename) > 0
        self._file = open(self.filename, "a" if self.append else "w", newline="")
        fields = ["epoch", "loss"] + (["val_loss"] if self.params["validation"] else [])
        self._writer = csv.DictWriter(self._file, fields, delimiter=self.separator)
        if not exists:
            self._writer.writeheader()
        self._file.flush()

    def on_epoch_end(self, epoch, logs=None):
        self._writer.writerow({"epoch": epoch, **logs})
        self._file.flush()

    def on_train_end(self, logs=None):
        if self._file is not None:
            self._file.close()


class EarlyStopping(Callback):
    """Stop the training when `monitor` ('val_loss' or 'loss') has not improved by more than `min_delta` for
    `patience` epochs (`mode` 'min', 'max' or 'auto': min for a loss). See the module's docstring for what a stop
    gives and what it does not (the parameters)."""

    def __init__(self, monitor="val_loss", patience=0, min_delta=0.0, mode="auto"):
        if monitor not in ("loss", "val_loss"):
            raise ValueError(f"EarlyStopping monitors 'loss' or 'val_loss' (what fit persists), not {monitor!r}")
        if int(patience) < 0:
            raise ValueError(f"patience must be >= 0, not {patience}")
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"mode must be 'auto', 'min' or 'max', not {mode!r}")
        self.monitor, self.patience, self.min_delta = monitor, int(patience), abs(float(min_delta))
        self.sign = -1.0 if mode == "max" else 1.0
        self.best, self.best_epoch, self.wait, self.stopped_epoch = math.inf, None, 0, None

    def check(self, validation):
        if self.monitor == "val_loss" and not validation:
            raise ValueError("EarlyStopping(monitor='val_loss') needs validation losses: give the model "
                             "validation_data, or monitor='loss'")

    def on_train_begin(self, logs=None):
        self.best, self.best_epoch, self.wait, self.stopped_epoch = math.inf, None, 0, None

    def on_epoch_end(self, epoch, logs=None):
        current = self.sign * logs[self.monitor]
        if current < self.best - self.min_delta:
            self.best, self.best_epoch, self.wait = current, epoch, 0
            return
        self.wait += 1
        if self.wait > self.patience:
            self.stopped_epoch = epoch
            self.stop_reason = (f"EarlyStopping: {self.monitor} did not improve for {self.wait} epochs "
                                f"(best {self.sign * self.best:.6g} after epoch {self.best_epoch + 1})")
            self.model.stop_training = True


class MLflow(Callback):
    """Logs `loss` per step and `loss`/`val_loss` per epoch to MLflow, in a run it starts (`run_name`) in
    `experiment` at `tracking_uri` (default: MLflow's, `$MLFLOW_TRACKING_URI` or ./mlruns), with `params`.
    Needs `pip install 'ravop-engine[mlflow]'`."""

    def __init__(self, experiment=None, run_name=None, tracking_uri=None, params=None):
        try:
            import mlflow
        except ImportError:
            raise _missing_extra("the MLflow callback", "mlflow", "mlflow") from None
        self.mlflow = mlflow
        self.experiment, self.run_name, self.tracking_uri = experiment, run_name, tracking_uri
        self.run_params = dict(params or {})
        self.run = None

    def on_train_begin(self, logs=None):
        if self.tracking_uri is not None:
            self.mlflow.set_tracking_uri(self.tracking_uri)
        if self.experiment is not None:
            self.mlflow.set_experiment(self.experiment)
        self.run = self.mlflow.start_run(run_name=self.run_name)
        self.mlflow.log_params({**self.params, **self.run_params})

    def on_batch_end(self, batch, logs=None):
        self.mlflow.log_metric("batch_loss", logs["loss"], step=logs["step"])

    def on_epoch_end(self, epoch, logs=None):
        self.mlflow.log_metrics(logs, step=epoch + 1)

    def on_train_end(self, logs=None):
        if self.run is not None:
            self.mlflow.end_run(status="FINISHED" if logs["state"] == graph_states.DONE else "KILLED")


class WandB(Callback):
    """Logs `batch_loss` per step and `loss`/`val_loss` per epoch to Weights & Biases, in a run `wandb.init(project,
    name=name, config=config, **init_kwargs)` starts. Needs `pip install 'ravop-engine[wandb]'`."""

    def __init__(self, project=None, name=None, config=None, **init_kwargs):
        try:
            import wandb
        except ImportError:
            raise _missing_extra("the WandB callback", "wandb", "wandb") from None
        self.wandb = wandb
        self.init_kwargs = {"project": project, "name": name, "config": config, **init_kwargs}
        self.run = None

    def on_train_begin(self, logs=None):
        self.run = self.wandb.init(**self.init_kwargs)

    def on_batch_end(self, batch, logs=None):
        self.run.log({"batch_loss": logs["loss"], "step": logs["step"]})

    def on_epoch_end(self, epoch, logs=None):
        self.run.log({**logs, "epoch": epoch + 1})

    def on_train_end(self, logs=None):
        if self.run is not None:
            self.run.finish(exit_code=0 if logs["state"] == graph_states.DONE else 1)


class FitFollower:
    """The watcher (`ravop.watching`) of one fit: reads the persisted losses as the graph trains and turns them
    into callback events; cancels the graph when a callback asks to stop."""

    def __init__(self, callbacks, model, history, clock):
        self.callbacks, self.model, self.history, self.clock = callbacks, model, history, clock
        epochs, steps = history.params["epochs"], history.params["steps"]
        self.per_epoch = steps // epochs
        params = {"epochs": epochs, "steps": self.per_epoch, "validation": history.params["validation"]}
        model.stop_training = False
        for callback in callbacks:
            callback.set_model(model)
            callback.set_params(params)
        self.started = self.stopped = False
        self.steps_seen = self.epochs_seen = 0
        self.next_read = 0.0

    def poll(self, client, keys, state):
        if state != graph_states.RUNNING or self.stopped:
            return
        now = self.clock()
        if now < self.next_read:
            return
        self.next_read = now + POLL_SECONDS
        self._feed(client, keys)

    def ended(self, client, keys, state):
        if not self.stopped and state == graph_states.DONE:
            self._feed(client, keys)
        if not self.started:
            self._begin()
        logs = {"state": state, "stopped_after": self.history.stopped_after}
        for callback in self.callbacks:
            callback.on_train_end(logs)
        return self.history.stop_reason   # None unless this fit's callbacks cancelled the graph

    def _begin(self):
        self.started = True
        for callback in self.callbacks:
            callback.on_train_begin({})

    def _feed(self, client, keys):
        if not self.started:
            self._begin()
        losses = training_losses.read(client, keys)
        batch = losses.batch
        missing = np.isnan(batch)
        computed = int(missing.argmax()) if missing.any() else len(batch)   # the loop persists them in order
        validation = self.history.params["validation"]
        while self.epochs_seen < self.history.params["epochs"] and not self.stopped:
            epoch = self.epochs_seen
            end = (epoch + 1) * self.per_epoch
            for step in range(self.steps_seen, min(end, computed)):
                for callback in self.callbacks:
                    callback.on_batch_end(step - epoch * self.per_epoch, {"loss": float(batch[step]), "step": step + 1})
                self.steps_seen = step + 1
            if computed < end or (validation and (len(losses.validation) <= epoch
                                                  or math.isnan(losses.validation[epoch]))):
                return
            logs = {"loss": float(batch[epoch * self.per_epoch:end].mean())}
            if validation:
                logs["val_loss"] = float(losses.validation[epoch])
            for callback in self.callbacks:
                callback.on_epoch_end(epoch, logs)
            self.epochs_seen = epoch + 1
            if self.model.stop_training:
                self._stop(client, keys, epoch)

    def _stop(self, client, keys, epoch):
        why = next((c.stop_reason for c in self.callbacks if c.stop_reason), "a callback set stop_training")
        reason = f"stopped early after epoch {epoch + 1} by a fit callback ({why})"
        self.stopped = True   # no event after this epoch, whatever the worker still runs
        if status.cancel(client, keys, reason):
            self.history.stopped(epoch + 1, reason)
        # else the graph had ended before the stop landed: it trained to the end, and History has every epoch


def checked(callbacks, validation):
    """The callbacks of a fit as a list, refused before anything is recorded if one cannot follow it."""
    callbacks = list(callbacks or ())
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise TypeError(f"callbacks take ravdl.v2.callbacks.Callback instances, not {type(callback).__name__}")
        callback.check(validation)
    return callbacks


def follow(callbacks, model, history):
    """Register the (checked) callbacks of a fit that returned `history`, to be fed while the graph is tracked."""
    if callbacks:
        watching.watch(history.graph.id, FitFollower(callbacks, model, history, time.monotonic))
