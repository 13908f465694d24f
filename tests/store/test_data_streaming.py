"""A fit's training array streams to a worker that reads it from the store: the worker reads the chunks under
the batch its loop reaches and a window ahead, drops those behind, and reads them again the next epoch; the
results are the bits of the in-process evaluation. A shuffled fit reads its data once, whole. fit takes a .npy
path or a read-only memmap without copying it. Real server and workers (a worker with RAVOP_SAME_HOST=off reads as
a remote one does)."""
import numpy as np
import pytest
import torch

import ravop as R
from helpers import commands_seen, on_one_thread
from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import Activation, Dense
from ravdl.v2.optimizers import Adam
from ravop.core.errors import PlanError, WireFormatError
from ravop.core.loop_template import LoopSpec, RowHole, StepTemplate
from ravop.runtime.evaluate import evaluate_persisted
from ravop.runtime.loop_run import LoopRun
from ravop.store import row_stream, tensors
from ravop.store import same_host as same_host_files

CHUNK = 16 * 2**10
rng = np.random.default_rng(11)
X = rng.normal(size=(2000, 16)).astype(np.float32)   # 128,000 bytes: 8 chunks of 16 KiB
Y = (X[:, :1] - 0.5 * X[:, 3:4]).astype(np.float32)


def write_rows(client, key, tensor, chunk):
    pipe = client.pipeline(transaction=False)
    tensors.write(pipe, key, tensor, size=chunk)
    pipe.execute()
    return tensors.decode(client, key, client.get(key), stream_to="cpu")


def test_rows_stream_a_window_at_a_time_with_the_same_bits(client):
    data = torch.from_numpy(rng.normal(size=(1000, 64)).astype(np.float32))   # 256 bytes a row, 32 chunks
    try:
        rows = write_rows(client, "stream-test", data, 8192)
        assert isinstance(rows, row_stream.StreamedRows)
        for epoch in range(2):
            for start in range(0, 1000, 30):   # a short last batch, batches across chunk boundaries
                batch = rows.read_rows(slice(start, start + 30))
                assert torch.equal(batch, data[start:start + 30])
        # a batch spans at most 2 chunks; 4 batches ahead (30 KiB) are 4 chunks of 8 KiB
        assert rows.chunks_ahead(30) == 4 and rows.most_held <= 2 + 4
        assert data.nbytes * 2 <= rows.bytes_read <= data.nbytes * 2 + 5 * 8192   # each epoch read once
        with pytest.raises(ValueError, match="non-empty range"):
            rows.read_rows(slice(0, 10, 2))
        client.delete(tensors.chunks_key("stream-test"))
        with pytest.raises(WireFormatError, match="chunk 15 is gone or changed while a loop read its rows"):
            rows.read_rows(slice(500, 510))   # chunk 15 was dropped behind its batch: read again, and gone
    finally:
        client.delete(*tensors.keys_of("stream-test"))


def test_a_whole_read_asks_for_its_chunks_a_few_at_a_time_with_the_same_bits(client, monkeypatch):
    """A tensor read whole (a shuffled fit's data) comes in pipelines of READ_BATCH_BYTES of chunks, so that the
    server never queues the whole value in its output buffer (2x the data there: docs/reports/benchmarks.md)."""
    monkeypatch.setattr(tensors, "READ_BATCH_BYTES", 3 * 8192)   # 3 chunks a round trip
    data = torch.from_numpy(rng.normal(size=(1000, 64)).astype(np.float32))   # 32 chunks of 8 KiB
    pipelines, read_into = [], tensors._read_replies_into
    monkeypatch.setattr(tensors, "_read_replies_into",
                        lambda client, commands, *rest: pipelines.append(len(commands)) or read_into(client, commands,
                                                                                                   *rest))
    try:
        pipe = client.pipeline(transaction=False)
        tensors.write(pipe, "whole-test", data, size=8192)
        pipe.execute()
        assert torch.equal(tensors.read(client, "whole-test"), data)
        assert pipelines == [3] * 10 + [2]
    finally:
        client.delete(*tensors.keys_of("whole-test"))


def test_a_shuffled_loop_refuses_streamed_rows(client):
    data = torch.zeros(100, 40)
    try:
        rows = write_rows(client, "stream-shuffled", data, 4096)
        loop = LoopSpec(templates=[StepTemplate([], [], rows=10, row_holes=[RowHole(2, 1)])], schedule=[(0, 10)],
                        n_carried=0, outer_ids=[1], n_steps=10, batch_size=10, n_rows=100, shuffle=True)
        with pytest.raises(PlanError, match="shuffled loop .* cannot stream"):
            LoopRun(loop, [rows], 0)
    finally:
        client.delete(*tensors.keys_of("stream-shuffled"))


def fit(name, shuffle, data=X, targets=Y):
    R.Graph(name=name)
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(8, input_shape=(16,)))
    model.add(Activation("relu"))
    model.add(Dense(1))
    history = model.fit(data, targets, n_epochs=3, batch_size=50, shuffle=shuffle, seed=3)
    model.predict(X[:64]).persist_op("prediction")
    return history


def chunk_reads(seen):
    """The chunk reads of a MONITOR's commands (`HGET {key}:c {index}`)."""
    return sum(1 for command in seen if command.startswith("HGET ") and command.split()[1].endswith(":c"))


@pytest.mark.parametrize("shuffle", [False, True], ids=["in order", "shuffled"])
@pytest.mark.parametrize("same_host", ["off", "on"], ids=["remote-like worker", "local worker"])
def test_a_fit_streams_its_array_from_the_store_with_the_same_bits(engine, workers, server, monkeypatch, shuffle,
                                                                   same_host):
    """In order: every worker streams the array from the store, each epoch's chunks as the loop reaches them, and
    the requester writes it no same-host file. Shuffled: a worker reads it once, whole (a local one maps it)."""
    monkeypatch.setenv("RAVOP_SAME_HOST", same_host)   # the requester's and the worker's (off: read as remote)
    # the requester closes a file once its chunks are all sent (ravop.store.background_upload), which for this small
    # array may come before the worker maps it: kept open, as while a big array's chunks are still going up
    monkeypatch.setattr(same_host_files, "close_file", lambda reference: None)
    workers.start(1)
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", str(CHUNK))
    history = fit(f"{shuffle} {same_host}", shuffle)
    expected = on_one_thread(evaluate_persisted, R.current_graph(), ["prediction"])["prediction"]
    with commands_seen(server.url) as seen:
        R.activate()
        R.execute()
        R.track_progress(progress_bar=False, timeout=300)
    n_chunks = -(-X.nbytes // CHUNK)
    reads = chunk_reads(seen)
    files = [command for command in seen if command.startswith("SET ") and command.split()[1].endswith(":f")]
    if not shuffle:
        assert 3 * n_chunks <= reads <= 3 * n_chunks + 2 and not files, (reads, files)
    elif same_host == "off":
        assert reads == n_chunks and not files, (reads, files)   # read once, whole
    else:
        assert reads == 0 and len(files) == 1, (reads, files)   # mapped from the requester's file
    assert torch.equal(R.fetch_persisting_op("prediction"), expected)
    losses = history.batch_losses
    assert len(losses) == 3 * 40 and np.isfinite(losses).all()


def anonymous_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))


def test_fit_takes_npy_paths_and_read_only_memmaps_without_a_copy(engine, module_workers, tmp_path):
    """A .npy path (and np.load's read-only memmap, which R.t would copy) trains as the arrays do, its pages the
    file's: recording the fit of 64 MiB adds no 64 MiB of anonymous memory to the requester."""
    big = np.random.default_rng(2).standard_normal((65536, 256), dtype=np.float32)   # 64 MiB
    np.save(tmp_path / "X.npy", big)
    np.save(tmp_path / "y.npy", big[:, :1].copy())
    del big
    before = anonymous_kib()
    R.Graph(name="from paths")
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(1, input_shape=(256,)))
    model.fit(np.load(tmp_path / "X.npy", mmap_mode="r"), tmp_path / "y.npy", n_epochs=1, batch_size=8192)
    assert anonymous_kib() - before < 16 * 1024, "the requester copied the mapped file"
    paths = train_small("paths", tmp_path, lambda name: str(tmp_path / name))
    memmaps = train_small("memmaps", tmp_path, lambda name: np.load(tmp_path / name, mmap_mode="r"))
    arrays = train_small("arrays", tmp_path, lambda name: np.load(tmp_path / name))
    for other in (paths, memmaps):
        assert np.array_equal(other[0], arrays[0]) and np.array_equal(other[1], arrays[1])


def train_small(name, tmp_path, given):
    np.save(tmp_path / "small_X.npy", X)
    np.save(tmp_path / "small_y.npy", Y)
    history = fit(name, False, given("small_X.npy"), given("small_y.npy"))
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    return history.batch_losses, R.fetch_persisting_op("prediction").numpy()


def test_a_path_that_is_not_a_npy_array_of_the_rows_of_y_is_refused_naming_it(tmp_path):
    R.Graph(name="bad paths")
    model = NeuralNetwork(Adam(lr=0.01), loss="SquareLoss")
    model.add(Dense(1, input_shape=(16,)))
    with pytest.raises(FileNotFoundError, match="X names no file: .*missing.npy"):
        model.fit(str(tmp_path / "missing.npy"), Y, n_epochs=1, batch_size=10)
    (tmp_path / "text.npy").write_text("not an array")
    with pytest.raises(ValueError, match="y .*text.npy.* is not a .npy file of numbers"):
        model.fit(X, tmp_path / "text.npy", n_epochs=1, batch_size=10)
    np.save(tmp_path / "short.npy", X[:100])
    with pytest.raises(ValueError, match=r"same number of rows, not shapes \(100, 16\) and \(2000, 1\)"):
        model.fit(tmp_path / "short.npy", Y, n_epochs=1, batch_size=10)
