"""A chunked tensor's rows read from its chunks as a training loop consumes them, instead of the whole tensor
before the first step. An unshuffled fit's batches come in order, so the reader holds the chunks under the
current batch and a window ahead of it (read on a thread while the step runs, wrapping to the first chunks
before an epoch ends), and drops those behind: a worker holds the window, not the data set, and the server
sends one window's chunks at a time (a whole value asked for at once sits in its output buffer: 2x the data).

Same bits: a batch is the very bytes of the chunks the whole tensor would be read from. A shuffled fit reads
rows from every chunk in each batch, so it is not streamed (the worker reads the tensor once): see
docs/users/training_loops.md for the measurement behind that choice.
"""
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Dict, Optional

import torch

from ..core.errors import WireFormatError
from ..wire.codec import Chunked

WINDOW_BATCHES = 4   # batches read ahead of the one a step reads: the reads keep ahead of a fast step

# One reading thread for every stream of the process: a worker runs one loop at a time, and the chunks of one
# stream arrive in the order they were asked for.
_reader = ThreadPoolExecutor(1, thread_name_prefix="ravop-rows")


class StreamedRows:
    """The rows of the chunked tensor `head` declares under `key` (its chunks checked against the header by the
    caller), read a window at a time by `read_chunk(index)` (its bytes, None if the chunk is gone or changed);
    `read_rows(slice)` gives a batch on `device`."""

    def __init__(self, key: str, head: Chunked, read_chunk: Callable[[int], Optional[torch.Tensor]],
                 device: str = "cpu") -> None:
        if not head.shape or head.shape[0] < 1:
            raise WireFormatError(f"chunked tensor {key}: its rows cannot stream (shape {tuple(head.shape)})")
        self.key, self.head, self.read_chunk, self.device = key, head, read_chunk, device
        self.shape, self.dtype = tuple(head.shape), head.dtype
        self.row_bytes = head.nbytes // head.shape[0]
        self.chunks: Dict[int, Future] = {}   # chunk index -> its bytes (a uint8 tensor), read or being read
        self.bytes_read = 0
        self.most_held = 0   # the most chunks held at once (the window, bounded: tests read it)

    def __len__(self) -> int:
        return self.shape[0]

    def read_rows(self, rows: slice) -> torch.Tensor:
        """Rows `rows.start` to `rows.stop` (a plain slice), read from their chunks, then those ahead."""
        start, stop, step = rows.indices(self.shape[0])
        if step != 1 or stop <= start:
            raise ValueError(f"streamed rows of {self.key} are read as a non-empty range, not {rows}")
        begin, end = start * self.row_bytes, stop * self.row_bytes
        size = self.head.chunk_bytes
        first, last = begin // size, (end - 1) // size
        ahead = self.chunks_ahead(stop - start)
        wanted = list(dict.fromkeys([*range(first, last + 1),
                                     *((last + k) % self.head.n_chunks for k in range(1, ahead + 1))]))
        keep = set(wanted)
        for index in list(self.chunks):
            if index not in keep:
                self.chunks.pop(index).cancel()   # behind the batch: dropped (a read under way is let finish)
        missing = [index for index in wanted if index not in self.chunks]
        for index in missing:
            self.chunks[index] = _reader.submit(self._read_chunk, index)
        self.most_held = max(self.most_held, len(self.chunks))
        batch = torch.empty(end - begin, dtype=torch.uint8)
        for index in range(first, last + 1):
            data = self.chunks[index].result()
            lo, hi = max(begin, index * size), min(end, index * size + len(data))
            batch[lo - begin:hi - begin] = data[lo - index * size:hi - index * size]
        return batch.view(self.dtype).reshape(stop - start, *self.shape[1:]).to(self.device)

    def chunks_ahead(self, batch_rows: int) -> int:
        """The chunks read ahead of a batch of `batch_rows` rows: those of WINDOW_BATCHES such batches, at least one
        (the next chunk is there before the step reaches it), at most all."""
        window = -(-WINDOW_BATCHES * batch_rows * self.row_bytes // self.head.chunk_bytes)
        return min(max(1, window), self.head.n_chunks)

    def _read_chunk(self, index: int) -> torch.Tensor:
        data = self.read_chunk(index)
        if data is None:
            raise WireFormatError(f"chunked tensor {self.key}: chunk {index} is gone or changed while a loop "
                                  "read its rows (flushed?)")
        self.bytes_read += len(data)
        return data
