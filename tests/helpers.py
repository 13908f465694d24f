"""Plain helpers shared by test modules (fixtures live in conftest.py)."""
import ravop as R


def run_ops(ops, timeout=300):
    """Persist `ops`, run the current graph on the workers, and fetch their values, in order."""
    for i, op in enumerate(ops):
        op.persist_op(f"value_{i}")
    R.activate()
    R.execute()
    R.track_progress(progress_bar=False, timeout=timeout)
    return [R.fetch_persisting_op(f"value_{i}") for i in range(len(ops))]
