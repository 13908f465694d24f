"""What a Jupyter notebook shows: History and a model's summary as HTML tables (`_repr_html_`), and summary()
displayed rather than printed in a kernel."""
import sys
import types

import numpy as np

import ravop as R
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam


def model():
    net = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss", validation_data=(np.ones((4, 3), np.float32),
                                                                           np.ones((4, 1), np.float32)))
    net.add(Dense(5, input_shape=(3,)))
    net.add(Activation("relu"))
    net.add(Dense(1))
    return net


def test_history_is_an_html_table_of_its_epochs(engine, module_workers):
    R.Graph(name="notebook <b>")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3)).astype(np.float32)
    history = model().fit(X, X[:, :1], n_epochs=3, batch_size=4)
    before = history._repr_html_()
    assert "History of 9 steps over 3 epochs" in before and "has not run" in before
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    table = history._repr_html_()
    assert "<caption>graph &#x27;notebook &lt;b&gt;&#x27;, 9 steps</caption>" in table   # escaped
    assert "<th>epoch</th><th>loss</th><th>val_loss</th>" in table
    for epoch, (loss, val) in enumerate(zip(history.history["loss"], history.history["val_loss"]), 1):
        assert f"<tr><td>{epoch}</td><td>{loss:.6g}</td><td>{val:.6g}</td></tr>" in table


def test_summary_is_printed_in_a_terminal_and_displayed_in_a_kernel(monkeypatch, capsys):
    net = model()
    net.summary()
    printed = capsys.readouterr().out
    assert "Dense_1       Dense       (None, 5)     20" in printed and "Total params: 26" in printed
    html = net.summary_table()._repr_html_()
    assert "<tr><td>Dense_2</td><td>Dense</td><td>(None, 1)</td><td>6</td></tr>" in html
    assert "Total params: 26" in html
    shown = []
    kernel = types.SimpleNamespace(config={"IPKernelApp": {}})
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: kernel))
    monkeypatch.setitem(sys.modules, "IPython.display", types.SimpleNamespace(display=shown.append))
    net.summary()
    assert capsys.readouterr().out == "" and [table._repr_html_() for table in shown] == [html]
