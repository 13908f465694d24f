"""Fetching a finished graph's values one name at a time, as the RavDL guide loops over its losses, reads
all its small values in one round trip and answers the rest from that copy: the values are the stored ones,
each fetch gets its own tensor, a fit's losses are those R.fetch_losses reads, a large value is still read on
its own, and a new graph (activated or flushed) is never answered from the old one's copy. Real server and
workers."""
import pytest
import torch

from ravdl.v2 import NeuralNetwork
from ravdl.v2.callbacks import Callback
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
import ravop as R
from ravop.client import fetching, stored_values
from ravop.client.session import require
from ravop.client.stored_values import SMALL_BYTES
from ravop.core.errors import RavopError
from ravop.core.loss_names import training_loss_name


def _record(scale, steps=20):
    """`steps` small values step_i = scale * i and one large one; their expected tensors by name."""
    R.Graph(name=f"cache {scale}")
    base = R.t(torch.arange(1.0, 4.0))
    expected = {}
    for i in range(1, steps + 1):
        (base * (scale * i)).persist_op(f"step_{i}")
        expected[f"step_{i}"] = torch.arange(1.0, 4.0) * (scale * i)
    ones = R.t(torch.ones(64, 64))
    (ones @ ones * scale).persist_op("large")   # 16 KiB: more than SMALL_BYTES
    expected["large"] = torch.full((64, 64), 64.0 * scale)
    assert expected["large"].numel() * 4 > SMALL_BYTES
    return expected


def _run():
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)


@pytest.fixture
def counted(monkeypatch):
    """Counts of the requests fetching makes: the one read of all small values, and single-value reads."""
    calls = {"all small": 0, "one": 0}
    read_small, fetch_one = stored_values.read_small_values, fetching.fetch_tensor

    def counting_read_small(*args):
        calls["all small"] += 1
        return read_small(*args)

    def counting_fetch_one(*args):
        calls["one"] += 1
        return fetch_one(*args)

    monkeypatch.setattr(stored_values, "read_small_values", counting_read_small)
    monkeypatch.setattr(fetching, "fetch_tensor", counting_fetch_one)
    return calls


def test_a_finished_graphs_small_values_come_in_one_round_trip(engine, module_workers, counted):
    expected = _record(1.0)
    _run()
    for name in [f"step_{i}" for i in range(1, 21)] * 2:
        assert torch.equal(R.fetch_persisting_op(name), expected[name])
    assert counted == {"all small": 1, "one": 0}
    assert torch.equal(R.fetch_persisting_op("large"), expected["large"])
    assert counted == {"all small": 1, "one": 1}   # too large for the copy: read on its own, every time
    fetched = R.fetch_persisting_op("step_3")
    assert fetched["result"].tolist() == [3.0, 6.0, 9.0]       # the original's dict form still answers
    fetched.add_(100)                                         # the caller's own tensor
    assert torch.equal(R.fetch_persisting_op("step_3"), expected["step_3"])
    with pytest.raises(R.UnknownPersistName):
        R.fetch_persisting_op("no_such_name")


def test_a_new_graph_is_never_answered_from_the_old_ones_copy(engine, module_workers, counted):
    first = _record(1.0)
    _run()
    assert torch.equal(R.fetch_persisting_op("step_2"), first["step_2"])
    second = _record(10.0)         # the same names, other values
    R.activate()
    with pytest.raises(R.NotComputedError):
        R.fetch_persisting_op("step_2")   # activated, not started: not the first graph's value
    R.execute()
    R.track_progress(progress_bar=False, timeout=120)
    assert torch.equal(R.fetch_persisting_op("step_2"), second["step_2"])
    assert torch.equal(R.fetch_persisting_op("step_20"), second["step_20"])
    assert counted["all small"] == 3    # the first graph's, the second's before its start, and once done
    R.flush()
    with pytest.raises((R.GraphStateError, R.UnknownPersistName)):
        R.fetch_persisting_op("step_2")
    assert require().done_values is None


def test_a_fits_losses_fetched_by_name_equal_those_read_together(engine, module_workers, counted):
    """The guide's loop over a fit's losses (step values a loop persists) gives what R.fetch_losses reads."""
    torch.manual_seed(0)
    X, y = torch.randn(40, 4).numpy(), torch.randint(0, 3, (40,)).numpy()
    R.Graph(name="fit", seed=0)
    model = NeuralNetwork(optimizer=Adam(lr=0.01), loss="CrossEntropy")
    model.add(Dense(8, input_shape=(4,)))
    model.add(Activation("relu"))
    model.add(Dense(3))
    model.fit(X, y, n_epochs=3, batch_size=10, shuffle=True)
    _run()
    by_name = [float(R.fetch_persisting_op(training_loss_name(epoch, batch)))
               for epoch in range(1, 4) for batch in range(1, 5)]
    assert counted == {"all small": 1, "one": 0}
    assert by_name == R.fetch_losses().batch.tolist() and len(set(by_name)) > 1


class BatchLosses(Callback):
    def __init__(self):
        self.losses = []

    def on_batch_end(self, batch, logs=None):
        self.losses.append(logs["loss"])


def test_a_fits_follower_and_the_fetches_after_it_share_one_read(engine, module_workers, counted):
    """As the graph ends, the fit's follower (History, callbacks) reads the losses with the small values the
    fetches by name then take from memory: one round trip for both, the same values."""
    torch.manual_seed(1)
    X, y = torch.randn(30, 4).numpy(), torch.randint(0, 3, (30,)).numpy()
    R.Graph(name="fit shared", seed=0)
    model = NeuralNetwork(optimizer=Adam(lr=0.01), loss="CrossEntropy")
    model.add(Dense(3, input_shape=(4,)))
    seen = BatchLosses()
    model.fit(X, y, n_epochs=2, batch_size=10, callbacks=[seen])
    _run()
    assert counted == {"all small": 1, "one": 0}   # read by the follower once the graph was done
    by_name = [float(R.fetch_persisting_op(training_loss_name(epoch, batch)))
               for epoch in range(1, 3) for batch in range(1, 4)]
    assert counted == {"all small": 1, "one": 0}
    assert seen.losses == by_name == R.fetch_losses().batch.tolist()


def test_losses_too_large_for_the_shared_read_are_read_as_before(engine, module_workers):
    """A value persisted under a loss name but larger than the small values read together: the losses are read on
    their own, which refuses it as a loss as R.fetch_losses does."""
    R.Graph(name="not a loss")
    (R.t(torch.ones(64, 64)) * 2.0).persist_op(training_loss_name(1, 1))
    _run()
    session = require()
    with pytest.raises(RavopError) as shared:
        fetching.done_losses(session.keys())
    with pytest.raises(RavopError) as alone:
        R.fetch_losses()
    assert str(shared.value) == str(alone.value) and "not a single loss value" in str(alone.value)
