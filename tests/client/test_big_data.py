"""Big tensors as a user meets them: R.t uses a numpy array as it is where it can (no second copy), and
uploads and downloads of big values show a progress bar in bytes, fed chunk by chunk. Real server and
workers."""
import numpy as np
import pytest
import torch

import ravop as R
from ravop.core import progress
from ravop.store import tensors


def constant_of(op):
    return op.graph.constants[op.id]


def test_r_t_uses_a_c_contiguous_array_as_it_is_and_copies_anything_else():
    R.Graph(name="no copy")
    X = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.shares_memory(constant_of(R.t(X)).numpy(), X)
    for other in (X.T, X.astype(">f4"), np.arange(3, dtype=np.uint16)):
        assert not np.shares_memory(constant_of(R.t(other)).numpy(), other)
    frozen = X.copy()
    frozen.flags.writeable = False
    assert not np.shares_memory(constant_of(R.t(frozen)).numpy(), frozen)   # torch would warn: copied instead
    torch.testing.assert_close(constant_of(R.t(X.T)), torch.from_numpy(X.T.copy()))


def test_a_big_tensor_is_written_and_read_chunk_by_chunk(client):
    tensor = torch.rand(1000, 1000)
    pipe = client.pipeline(transaction=False)
    queued = []
    written = tensors.write(pipe, "big-data-test", tensor, size=2**20, queued=queued.append)
    pipe.execute()
    assert len(queued) == 4 + 1 and sum(queued) == written   # 4 chunks of at most 1 MiB, then the header
    try:
        read = tensors.read(client, "big-data-test")
        torch.testing.assert_close(read, tensor, rtol=0, atol=0)
    finally:
        client.delete(*tensors.keys_of("big-data-test"))


def test_big_uploads_and_downloads_show_a_progress_bar(engine, module_workers, monkeypatch, capsys):
    monkeypatch.setattr(progress, "DELAY", 0)   # normally only after a second, on a slow transfer
    monkeypatch.setenv("RAVOP_CHUNK_BYTES", str(2**20))
    # No same-host file, so the chunks go before the start, under the bar (not after: store.background_upload)
    monkeypatch.setenv("RAVOP_SAME_HOST", "off")
    R.Graph(name="big values")
    X = np.random.default_rng(0).random((2048, 1024), dtype=np.float32)   # 8 MiB
    (R.t(X) * 2).persist_op("y")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=300)
    torch.testing.assert_close(R.fetch_persisting_op("y"), torch.from_numpy(X) * 2)
    err = capsys.readouterr().err
    assert "uploading constants" in err and "fetching 'y'" in err, err
    assert err.count("/8.39M") >= 2 and "B/s" in err, err   # the bars count bytes
