"""Plain helpers shared by test modules (fixtures live in conftest.py)."""
import torch

import ravop as R


def run_ops(ops, timeout=300):
    """Persist `ops`, run the current graph on the workers, and fetch their values, in order."""
    for i, op in enumerate(ops):
        op.persist_op(f"value_{i}")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=timeout)
    return [R.fetch_persisting_op(f"value_{i}") for i in range(len(ops))]


def on_one_thread(function, *args):
    """`function(*args)` on one torch thread, as the test workers run: an in-process reference that a
    multi-threaded reduction would sum in another order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return function(*args)
    finally:
        torch.set_num_threads(threads)
