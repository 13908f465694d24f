"""`fit` returns a Keras-style History, read lazily in one round trip once the graph has run; R.fetch_losses
reads the persisted losses of a graph as arrays, also while it trains; History.plot draws them."""
import matplotlib
import numpy as np
import pytest
import torch

import ravop as R
from ravdl.v2 import History, NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam

matplotlib.use("Agg")

EPOCHS, BATCHES = 4, 3


def record_fit(validation=True):
    R.Graph(name="history")
    rng = np.random.default_rng(1)
    X = rng.normal(size=(75, 6)).astype(np.float32)
    y = X[:, :1] - X[:, 1:2]
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss",
                          validation_data=(X[:20], y[:20]) if validation else None)
    model.add(Dense(8, input_shape=(6,)))
    model.add(Activation("tanh"))
    model.add(Dense(1))
    return model.fit(X, y, n_epochs=EPOCHS, batch_size=25)


def run_graph():
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)


def count_commands(monkeypatch, client):
    """A list that gets one entry per command `client` sends (its pipelines excepted)."""
    sent, send = [], client.execute_command
    monkeypatch.setattr(client, "execute_command", lambda *args, **kw: sent.append(args[0]) or send(*args, **kw))
    return sent


def test_history_holds_epoch_and_batch_losses(engine, module_workers, monkeypatch):
    history = record_fit()
    assert isinstance(history, History) and history[0] == "training_loss_epoch_1_batch_1"  # also the loss names
    assert len(history) == EPOCHS * BATCHES
    with pytest.raises(R.NotComputedError, match="has not run"):
        history.history
    run_graph()
    batches = np.array([float(R.fetch_persisting_op(f"training_loss_epoch_{e}_batch_{b}"))
                        for e in range(1, EPOCHS + 1) for b in range(1, BATCHES + 1)])
    validation = [float(R.fetch_persisting_op(f"validation_loss_epoch_{e}")) for e in range(1, EPOCHS + 1)]
    R.fetch_losses()  # loads the script on the server, so that the count below is of the read itself
    sent = count_commands(monkeypatch, engine.client)
    assert history.batch_losses.tolist() == batches.tolist()
    assert sent == ["EVALSHA"]  # every loss in one round trip
    assert history.history == {"loss": batches.reshape(EPOCHS, BATCHES).mean(axis=1).tolist(),
                               "val_loss": validation}
    assert sent == ["EVALSHA"]  # read once, then kept
    assert history.epoch == list(range(EPOCHS)) and history.params["steps"] == EPOCHS * BATCHES
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_plot_draws_batch_epoch_and_validation_losses(engine, module_workers):
    history = record_fit()
    run_graph()
    ax = history.plot()
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"batch loss", "loss", "val_loss"}
    np.testing.assert_array_equal(lines["batch loss"].get_ydata(), history.batch_losses)
    np.testing.assert_array_equal(lines["loss"].get_ydata(), history.history["loss"])
    np.testing.assert_array_equal(lines["val_loss"].get_xdata(), np.arange(1, EPOCHS + 1))


def test_fetch_losses_reads_a_graph_by_name_while_or_after_it_runs(engine, module_workers):
    record_fit(validation=False)
    R.activate()
    # Activated, not started: no value yet (not even those constant folding computed at compile time).
    partial = R.fetch_losses("history")
    assert partial.state == "activated" and len(partial.batch) == EPOCHS * BATCHES
    assert np.isnan(partial.batch).all() and partial.validation.size == 0
    assert partial.epoch.tolist() == [e for e in range(1, EPOCHS + 1) for _ in range(BATCHES)]
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    losses = R.fetch_losses(engine.graph_id)
    assert losses.state == "done" and not np.isnan(losses.batch).any()
    assert losses.to_json()["batch"] == losses.batch.tolist()
    with pytest.raises(R.RavopError, match="no graph with id or name 'nosuch'"):
        R.fetch_losses("nosuch")


def test_losses_of_a_hand_written_loop_by_step(engine, module_workers):
    R.Graph(name="steps")
    w = R.t(torch.tensor([3.0]))
    for step in range(1, 6):
        loss = (w * w).sum()
        loss.persist_op(f"training_loss_step_{step}")
        w = w - 0.1 * R.grad(loss, [w])[0]
    run_graph()
    losses = R.fetch_losses()
    np.testing.assert_allclose(losses.batch, [9 * 0.64 ** k for k in range(5)], rtol=1e-5)
    assert losses.epoch.tolist() == [0] * 5
