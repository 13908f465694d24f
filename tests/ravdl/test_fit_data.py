"""fit from the data objects users have: a DataLoader or a map-style Dataset trains bitwise as the same arrays do
(through real workers), torch tensors as numpy arrays; what cannot be honoured is refused, naming why."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import ravop as R
from ravdl.v2 import Functional, NeuralNetwork, Pytorch_Model
from ravdl.v2 import fit_data
from ravdl.v2.callbacks import CSVLogger
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam

rng = np.random.default_rng(5)
X = rng.normal(size=(70, 6)).astype(np.float32)
Y = (X[:, :1] * 2 - X[:, 2:3]).astype(np.float32)


def train(name, data, **fit):
    """(batch losses, predictions on X) of a small MLP fitted on `data` (fit's positional arguments)."""
    R.Graph(name=name)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(8, input_shape=(6,)))
    model.add(Activation("relu"))
    model.add(Dense(1))
    history = model.fit(*data, n_epochs=3, **fit)
    model.predict(X).persist_op("prediction")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False)
    return history.batch_losses, R.fetch_persisting_op("prediction").numpy()


class Pairs(Dataset):
    """A map-style dataset of numpy (x, y) rows, counting the items read."""

    def __init__(self, x, y):
        self.x, self.y, self.reads = x, y, 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.reads += 1
        return self.x[i], self.y[i]


def test_a_dataloader_a_dataset_and_tensors_train_bitwise_as_the_arrays(engine, module_workers):
    losses, prediction = train("arrays", (X, Y), batch_size=16, shuffle=True, seed=7)
    assert len(losses) == 3 * 5 and not np.isnan(losses).any()
    loader = DataLoader(TensorDataset(torch.from_numpy(X), torch.from_numpy(Y)), batch_size=16, shuffle=True)
    from_loader = train("loader", (loader,), seed=7)
    from_dataset = train("dataset", (Pairs(X, Y),), batch_size=16, shuffle=True, seed=7)
    from_tensors = train("tensors", (torch.from_numpy(X), torch.from_numpy(Y)), batch_size=16, shuffle=True,
                         seed=7)
    for other in (from_loader, from_dataset, from_tensors):
        assert np.array_equal(other[0], losses) and np.array_equal(other[1], prediction)


def test_what_fit_cannot_take_is_refused_before_reading_it(monkeypatch):
    tensors = TensorDataset(torch.from_numpy(X), torch.from_numpy(Y))

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(())

    with pytest.raises(TypeError, match="not an IterableDataset"):
        fit_data.training_data(DataLoader(Stream(), batch_size=4), None, None, False)
    with pytest.raises(NotImplementedError, match="drop_last=True"):
        fit_data.training_data(DataLoader(tensors, batch_size=4, drop_last=True), None, None, False)
    with pytest.raises(ValueError, match="differs from the DataLoader's batch_size 4"):
        fit_data.training_data(DataLoader(tensors, batch_size=4), None, 8, False)
    with pytest.raises(ValueError, match="takes no y"):
        fit_data.training_data(tensors, Y, 4, False)
    with pytest.raises(ValueError, match="needs y"):
        fit_data.training_data(X, None, 4, False)
    with pytest.raises(TypeError, match=r"item 0 of the Dataset is a tuple of 3: fit takes items that are \(x, y\)"):
        fit_data.training_data(TensorDataset(torch.ones(3, 2), torch.ones(3), torch.ones(3)), None, 2, False)
    big = Pairs(X, Y)
    monkeypatch.setattr(fit_data, "available_memory", lambda: 1000)
    with pytest.raises(MemoryError, match="70 items take about .* more than 50% of the 0.00 GiB"):
        fit_data.training_data(big, None, 4, False)
    assert big.reads == 1    # refused after the first item, not after reading it all


def test_a_loader_gives_its_batch_size_and_shuffling():
    loader = DataLoader(TensorDataset(torch.from_numpy(X), torch.from_numpy(Y)), batch_size=16, shuffle=True)
    x, y, batch_size, shuffle = fit_data.training_data(loader, None, None, False)
    assert batch_size == 16 and shuffle is True
    assert torch.equal(x, torch.from_numpy(X)) and torch.equal(y, torch.from_numpy(Y))
    assert fit_data.training_data(DataLoader(loader.dataset, batch_size=5), None, None, False)[2:] == (5, False)


class TwoLayers(Functional):
    def __init__(self):
        super().__init__()
        self.first = Dense(8, input_shape=(6,))
        self.last = Dense(1)
        self.initialize_params(Adam(lr=0.01))

    def _forward_pass_call(self, input, training=True):
        return self.last._forward_pass(self.first._forward_pass(input, training=training).tanh(), training=training)


def pytorch_model():
    torch.manual_seed(0)
    model = Pytorch_Model(R.model(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))))
    model.initialize(Adam(lr=0.01))
    return model


@pytest.mark.parametrize("make", [TwoLayers, pytorch_model], ids=["Functional", "Pytorch_Model"])
def test_every_model_kind_takes_a_dataloader_and_callbacks(engine, module_workers, make, tmp_path):
    """Functional and Pytorch_Model fit from a DataLoader as from its arrays, and feed their callbacks."""
    results = []
    for data, fit in (((X, Y), dict(batch_size=10)),
                      ((DataLoader(TensorDataset(torch.from_numpy(X), torch.from_numpy(Y)), batch_size=10),), {})):
        R.Graph(name=f"any-model-{len(results)}")
        model = make()
        log = tmp_path / f"{len(results)}.csv"
        history = model.fit(*data, n_epochs=2, loss="SquareLoss", callbacks=[CSVLogger(log)], **fit)
        R.activate()
        R.execute()
        R.track_progress(progress_bar=False)
        rows = log.read_text().splitlines()
        assert rows[0] == "epoch,loss" and len(rows) == 3
        results.append((history.batch_losses, rows))
    assert np.array_equal(results[0][0], results[1][0]) and len(results[0][0]) == 14
    assert results[0][1] == results[1][1]
