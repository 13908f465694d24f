"""Which inputs of a loop subgraph stream: those its loop reads only as its steps' batches, in order. Such an
input, when chunked in the store and not mapped from a same-host file, is read a window of chunks at a time as
the steps reach them (`ravop.store.row_stream`), never whole: a worker holds the window, not the data set.

Not streamed: the inputs of a shuffled loop (each batch takes rows from anywhere), those a step's op reads whole
or per run, and carried values. The bits are the same either way: a batch is the same bytes."""
from typing import Any, Set

from ravop.wire import unpack_loop

from .loop_subgraph import check_loop_program


def streamed_inputs(subgraph: Any, program: Any) -> Set[int]:
    """The ids of the inputs of the loop subgraph `subgraph` (its checked `program`) that may stream."""
    spec = unpack_loop(subgraph.loop)
    if spec.shuffle:
        return set()
    rows, whole = set(), set(spec.outer_ids[:spec.n_carried])
    for template in spec.templates:
        rows.update(template.row_data)
        whole.update(template.run_values)
        for node in template.nodes:
            whole.update(node.inputs)
    by_rows, not_by_rows = set(), set()
    for outer_id, input_id in zip(spec.outer_ids, check_loop_program(program).inputs):
        (by_rows if outer_id in rows and outer_id not in whole else not_by_rows).add(input_id)
    return by_rows - not_by_rows
