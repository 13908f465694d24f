"""Issue 45: EarlyStopping (and TerminateOnNaN) act within an epoch or two whatever the epoch rate. Its decision is made in the fit's
loop where the losses are (ravdl/v2/loop_stopping.py, ravop.record.loop.Step.stop_if), so on a fast model (here
hundreds of epochs a second on a worker at full speed) the loop ends at the end of the deciding epoch, which the
requester's callback, seeing the same losses, names too; before, the callback's request arrived about a second
(tens of epochs) late."""
import numpy as np
import pytest
import torch

from ravdl.v2 import NeuralNetwork
from ravdl.v2.callbacks import EarlyStopping, TerminateOnNaN
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.nonfinite import NonFiniteWarning
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.core import graph_states
from ravop.store import graphs as store_graphs


def fast_model(validation=True):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(48, 6)).astype(np.float32)
    y = (X[:, :1] * 0.5 - X[:, 1:2] + 0.3 * rng.normal(size=(48, 1))).astype(np.float32)
    net = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss", validation_data=(X[:16], y[:16]) if validation else None)
    net.add(Dense(32, input_shape=(6,)))
    net.add(Activation("tanh"))
    net.add(Dense(1))
    return net, X, y


def run():
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)


def decisions(prefix, epochs):
    return [bool(R.fetch_persisting_op(f"{prefix}_epoch_{e}")) for e in range(1, epochs + 1)]


@pytest.mark.parametrize("monitor, min_delta, patience", [("val_loss", 1e-4, 3), ("loss", 1e9, 2)])
def test_early_stopping_ends_the_loop_at_the_epoch_that_decides(engine, module_workers, monitor, min_delta,
                                                                  patience):
    epochs = 400
    R.Graph(name=f"stop on {monitor}")
    net, X, y = fast_model(validation=monitor == "val_loss")
    stopper = EarlyStopping(monitor=monitor, patience=patience, min_delta=min_delta)
    history = net.fit(X, y, n_epochs=epochs, batch_size=16, callbacks=[stopper])
    net.predict(X).persist_op("prediction")
    run()
    meta = store_graphs.read_state(engine.client, engine.keys())
    assert meta["state"] == graph_states.DONE
    stopped = history.stopped_after
    assert stopped is not None and stopped < epochs, meta
    decided = decisions("early_stopping_1", stopped)
    decision = decided.index(True) + 1     # the first epoch whose end decided to stop (1-based)
    assert stopped - decision <= 2 and stopped == decision      # it ends right there, not a second later
    assert stopper.stopped_epoch + 1 == decision                 # the requester's callback, on the same losses, agrees
    if monitor == "loss":
        assert decision == patience + 2   # the first epoch improves on inf; none after by min_delta
    assert meta["stopped"] == (f"stopped early at epoch {stopped} of {epochs} (EarlyStopping: {monitor} did not "
                               f"improve for {patience + 1} epochs)")
    assert len(history.history["loss"]) == stopped
    # the parameters are those of a fit of that many epochs, bit for bit
    prediction = R.fetch_persisting_op("prediction")
    R.Graph(name="as long")
    net, X, y = fast_model(validation=monitor == "val_loss")
    net.fit(X, y, n_epochs=stopped, batch_size=16)
    net.predict(X).persist_op("prediction")
    run()
    assert torch.equal(R.fetch_persisting_op("prediction"), prediction)


def test_terminate_on_nan_ends_the_loop_at_the_end_of_the_epoch_of_the_first_non_finite_loss(engine, module_workers):
    R.Graph(name="nan in the loop")
    net, X, y = fast_model(validation=False)
    y = y.copy()
    y[40, 0] = np.nan                  # the last batch of every epoch: its loss is NaN from epoch 1 on
    with pytest.warns(NonFiniteWarning):
        history = net.fit(X, y, n_epochs=400, batch_size=16, callbacks=[TerminateOnNaN()])
        run()
    meta = store_graphs.read_state(engine.client, engine.keys())
    assert meta["state"] == graph_states.DONE
    assert history.stopped_after == 1 and decisions("terminate_on_nan_1", 1) == [True]
    assert meta["stopped"] == ("stopped early at epoch 1 of 400 (TerminateOnNaN: training loss not finite in this "
                               "epoch)")
    assert len(history.batch_losses) == 3 and np.isnan(history.batch_losses[2])
