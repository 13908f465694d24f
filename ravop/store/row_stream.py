"""A chunked tensor's rows read from its chunks as a training loop consumes them, instead of the whole tensor
before the first step. An unshuffled fit's batches come in order, so the reader holds the chunks under the
current batch and a window ahead of it (read on a thread while the step runs, wrapping to the first chunks
before an epoch ends), and drops those behind: a worker holds the window, not the data set, and the server
sends one window's chunks at a time (a whole value asked for at once sits in its output buffer: 2x the data).

Which data streams (`streamed_inputs`): a loop's inputs that it reads only as its steps' batches, in order. A
shuffled fit reads rows from every chunk in each batch, so its data is read once, whole; neither are the inputs a
step's op reads whole or per run, nor carried values. A worker streams those inputs where it reads them from the
store, and a requester writes no same-host file for them (ravop.store.graphs): a local worker streams them from
the store too, and the host holds the data twice (the user's array and the server's chunks), not three times; the
price is each epoch's read through the socket, which mapping the file did not cost (measured:
docs/reports/benchmarks.md, issue 46).

Same bits: a batch is the very bytes of the chunks the whole tensor would be read from.
"""
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Optional, Sequence, Set

import torch

from ..core import registry
from ..core.errors import WireFormatError
from ..core.loop_template import LoopSpec
from ..wire import unpack_loop, unpack_nodes
from ..wire.codec import Chunked

WINDOW_BATCHES = 4   # batches read ahead of the one a step reads: the reads keep ahead of a fast step

# One reading thread for every stream of the process: a worker runs one loop at a time, and the chunks of one
# stream arrive in the order they were asked for.
_reader = ThreadPoolExecutor(1, thread_name_prefix="ravop-rows")


def streamed_inputs(spec: LoopSpec, loop_inputs: Sequence[int]) -> Set[int]:
    """The ids among a loop op's inputs (`loop_inputs`, named `spec.outer_ids` in its templates) that stream."""
    if spec.shuffle:
        return set()
    rows: Set[int] = set()
    whole = set(spec.outer_ids[:spec.n_carried])
    for template in spec.templates:
        rows.update(r.data for r in template.row_holes)
        whole.update(i for r in template.run_holes for i in r.values)
        for node in template.nodes:
            whole.update(node.inputs)
    by_rows: Set[int] = set()
    not_by_rows: Set[int] = set()
    for outer_id, input_id in zip(spec.outer_ids, loop_inputs):
        (by_rows if outer_id in rows and outer_id not in whole else not_by_rows).add(input_id)
    return by_rows - not_by_rows


def streamed_constants(plan: Any) -> Set[int]:
    """The ids of the values that every subgraph of `plan` (a plan_pb2.Plan) reading them streams."""
    streamed: Set[int] = set()
    whole: Set[int] = set()
    for sub in plan.subgraphs:
        rows: Set[int] = set()
        if sub.HasField("loop"):
            loop = next((node for node in unpack_nodes(sub.nodes) if node.op in registry.LOOPS), None)
            rows = set() if loop is None else streamed_inputs(unpack_loop(sub.loop), loop.inputs)
        streamed |= rows
        whole.update(i for i in sub.inputs if i not in rows)
    return streamed - whole


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
        into = batch.numpy()   # numpy copies: torch's copy spins its threads against the reading one (20x slower)
        for index in range(first, last + 1):
            data = self.chunks[index].result().numpy()
            lo, hi = max(begin, index * size), min(end, index * size + len(data))
            into[lo - begin:hi - begin] = data[lo - index * size:hi - index * size]
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
