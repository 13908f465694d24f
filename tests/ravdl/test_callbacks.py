"""fit(callbacks=...) during real training runs on worker processes: the events in order, fed from the losses
the worker persists while R.track_progress() follows the graph; TensorBoard's event file read back with
tensorboard's own reader (one scalar per step), CSVLogger's rows, EarlyStopping ending a long run early through
the stop request with the parameters of a run that long, TerminateOnNaN and the non-finite warnings; the
optional loggers' missing extras named."""
import csv
import sys

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ravdl.v2 import NeuralNetwork
from ravdl.v2.callbacks import Callback, CSVLogger, EarlyStopping, MLflow, TensorBoard, TerminateOnNaN, WandB
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.nonfinite import NonFiniteWarning
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.core import graph_states
from ravop.store import graphs as store_graphs

from conftest import Workers

ROWS, BATCH = 60, 20    # 3 steps an epoch


@pytest.fixture(scope="module")
def module_workers(server, tmp_path_factory):
    """Two workers for this module's fits, each loop step paced to a slow device (a sleep to ~4 ms a step,
    whatever the host's load): a run the callbacks stop early then lasts for minutes if it is not stopped, so
    the request always arrives before its end (at full speed its 15,000 steps took ~0.5 s, and under load the
    stop sometimes came after them)."""
    pool = Workers(server.url, tmp_path_factory.mktemp("workers"))
    pool.start(2, extra=("--emulate-device-flops", "4e6"))
    yield pool
    pool.stop_all()


class Recorder(Callback):
    """Every event, in order."""

    def __init__(self):
        self.events = []

    def on_train_begin(self, logs=None):
        self.events.append(("begin", None, logs))

    def on_batch_end(self, batch, logs=None):
        self.events.append(("batch", batch, logs))

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch", epoch, logs))

    def on_train_end(self, logs=None):
        self.events.append(("end", None, logs))

    def of(self, kind):
        return [(index, logs) for event, index, logs in self.events if event == kind]


def model(validation=True):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(ROWS, 8)).astype(np.float32)
    y = X[:, :1] * 0.5 - X[:, 1:2]
    net = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss", validation_data=(X[:20], y[:20]) if validation else None)
    net.add(Dense(16, input_shape=(8,)))
    net.add(Activation("tanh"))
    net.add(Dense(1))
    return net, X, y


def run():
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)


def test_tensorboard_csv_and_a_callback_see_every_step_and_epoch(engine, module_workers, tmp_path):
    epochs = 6
    R.Graph(name="callbacks")
    net, X, y = model()
    recorder = Recorder()
    history = net.fit(X, y, n_epochs=epochs, batch_size=BATCH, callbacks=[
        recorder, TensorBoard(tmp_path / "tb"), CSVLogger(tmp_path / "log.csv")])
    run()
    steps = epochs * ROWS // BATCH
    batch_losses, per_epoch, val = history.batch_losses, history.history["loss"], history.history["val_loss"]
    # the events: begin, then each step's batch_end before its epoch's epoch_end, then end
    kinds = [event for event, _, _ in recorder.events]
    assert kinds[0] == "begin" and kinds[-1] == "end" and kinds.count("batch") == steps
    assert kinds[1:-1] == (["batch"] * 3 + ["epoch"]) * epochs
    assert [(b, logs["step"]) for b, logs in recorder.of("batch")] == [(s % 3, s + 1) for s in range(steps)]
    assert np.array_equal([logs["loss"] for _, logs in recorder.of("batch")], batch_losses)
    assert [e for e, _ in recorder.of("epoch")] == list(range(epochs))
    assert [logs["loss"] for _, logs in recorder.of("epoch")] == pytest.approx(per_epoch, rel=1e-12)
    assert [logs["val_loss"] for _, logs in recorder.of("epoch")] == val
    assert recorder.events[-1][2] == {"state": graph_states.DONE, "stopped_after": None}
    # TensorBoard: one scalar per step and per epoch, read back with tensorboard's event reader
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"batch/loss", "epoch/loss", "epoch/val_loss"}
    scalars = events.Scalars("batch/loss")
    assert [s.step for s in scalars] == list(range(1, steps + 1))
    assert np.array_equal(np.array([s.value for s in scalars], np.float32), batch_losses.astype(np.float32))
    assert [s.step for s in events.Scalars("epoch/val_loss")] == list(range(1, epochs + 1))
    assert np.array_equal([s.value for s in events.Scalars("epoch/val_loss")], np.float32(val))
    # CSVLogger: a header and one row per epoch
    with open(tmp_path / "log.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == list(range(epochs))
    assert [float(r["loss"]) for r in rows] == pytest.approx(per_epoch, rel=1e-12)
    assert [float(r["val_loss"]) for r in rows] == pytest.approx(val, rel=1e-12)


def test_early_stopping_ends_a_long_run_early_keeping_its_parameters(engine, module_workers):
    epochs = 5000                      # 20,000 steps: it would run for many seconds
    R.Graph(name="early-stop")
    net, X, y = model()
    recorder = Recorder()
    # min_delta no loss improves by: the second epoch does not improve, so it asks to stop after epoch 2
    stopper = EarlyStopping(monitor="val_loss", patience=0, min_delta=1e9)
    history = net.fit(X, y, n_epochs=epochs, batch_size=BATCH, callbacks=[stopper, recorder])
    net.predict(X).persist_op("prediction")
    run()    # returns: the loop stopped at an epoch boundary and the graph is done
    meta = store_graphs.read_state(engine.client, engine.keys())
    assert meta["state"] == graph_states.DONE
    # the loop decided at the end of epoch 2 and ended there (ravdl/v2/loop_stopping.py), the callback agreeing
    stopped = history.stopped_after
    assert stopped == 2 and stopper.stopped_epoch == 1
    assert meta["stopped"].startswith(f"stopped early at epoch {stopped} of {epochs} (EarlyStopping: val_loss did "
                                      "not improve for 1 epochs")
    assert store_graphs.steps_done(engine.client, engine.keys()) == stopped * 4   # 3 training steps + validation
    assert [e for e, _ in recorder.of("epoch")] == list(range(stopped))          # every epoch run, none after
    assert len(recorder.of("batch")) == 3 * stopped
    assert recorder.events[-1] == ("end", None, {"state": graph_states.DONE, "stopped_after": stopped})
    assert len(history.history["loss"]) == stopped and len(history.history["val_loss"]) == stopped
    assert len(history.batch_losses) == 3 * stopped and not np.isnan(history.batch_losses).any()
    # what was recorded after fit is computed from the parameters of the stopping epoch: those of a fit of that
    # many epochs, bit for bit
    prediction = R.fetch_persisting_op("prediction")
    R.Graph(name="as-long")
    net, X, y = model()
    shorter = net.fit(X, y, n_epochs=stopped, batch_size=BATCH)
    net.predict(X).persist_op("prediction")
    run()
    assert torch.equal(R.fetch_persisting_op("prediction"), prediction)
    assert np.array_equal(shorter.batch_losses, history.batch_losses)
    assert shorter.history["val_loss"] == history.history["val_loss"]


def test_terminate_on_nan_stops_a_diverging_run_and_the_warnings_name_what(engine, module_workers):
    R.Graph(name="nan")
    net, X, y = model(validation=False)
    y = y.copy()
    y[7, 0] = np.inf                   # the first epoch's loss is not finite: the data said it first
    with pytest.warns(NonFiniteWarning, match=r"fit: y holds 1 \+inf of its 60 values"):
        history = net.fit(X, y, n_epochs=5000, batch_size=BATCH, callbacks=[TerminateOnNaN()])
    with pytest.warns(NonFiniteWarning, match=r"training loss is (inf|nan) at epoch 1, batch 1 \(step 1\)"):
        run()
    meta = store_graphs.read_state(engine.client, engine.keys())
    assert meta["state"] == graph_states.DONE and "(TerminateOnNaN: training loss" in meta["stopped"]
    assert 1 <= history.stopped_after < 5000 and len(history.batch_losses) == 3 * history.stopped_after


def test_early_stopping_refuses_restore_best_weights():
    with pytest.raises(NotImplementedError, match="restore_best_weights=True"):
        EarlyStopping(monitor="loss", restore_best_weights=True)


def test_early_stopping_refuses_val_loss_without_validation_data(engine):
    R.Graph(name="no-validation")
    net, X, y = model(validation=False)
    with pytest.raises(ValueError, match="needs validation losses"):
        net.fit(X, y, n_epochs=2, batch_size=BATCH, callbacks=[EarlyStopping("val_loss")])
    with pytest.raises(TypeError, match="Callback instances"):
        net.fit(X, y, n_epochs=2, batch_size=BATCH, callbacks=[print])


@pytest.mark.parametrize("callback, extra", [(MLflow, "mlflow"), (WandB, "wandb")])
def test_a_missing_logger_names_its_extra(monkeypatch, callback, extra):
    monkeypatch.setitem(sys.modules, extra, None)   # what an environment without the package gives
    with pytest.raises(ImportError, match=rf"pip install 'ravop-engine\[{extra}\]'"):
        callback()


def test_a_missing_tensorboard_names_its_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match=r"pip install 'ravop-engine\[tensorboard\]'"):
        TensorBoard(tmp_path)


def test_fit_warns_of_non_finite_data_naming_each_array_and_its_counts(engine):
    R.Graph(name="dirty")
    net, X, y = model()
    X = torch.from_numpy(X.copy())
    X[0, :3] = float("nan")
    X[1, 0], X[2, 0] = float("inf"), -float("inf")
    with pytest.warns(NonFiniteWarning) as warned:
        net.fit(X, y, n_epochs=1, batch_size=BATCH)
    [message] = [str(w.message) for w in warned]
    assert message.startswith("fit: X holds 3 NaN, 1 +inf, 1 -inf of its 480 values")
    assert warned[0].filename == __file__    # said at the user's line
    R.Graph(name="dirty-validation")
    clean, X, y = model()
    X_val = np.array(clean.validation_data[0])
    X_val[4, 4] = np.nan
    clean.validation_data = (X_val, clean.validation_data[1])
    with pytest.warns(NonFiniteWarning, match="fit: validation X holds 1 NaN of its 160 values"):
        clean.fit(X, y, n_epochs=1, batch_size=BATCH)
