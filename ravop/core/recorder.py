"""The recorder as the op modules see it. The VJP rules of `index`, `index_backward` and `set_value`
(ravop.ops.indexing) record ops with canonical params, which no `R.<op>` function takes; they call `record` here,
which `ravop.record.graph` installs when it loads. VJP rules run only while a graph records (`R.grad`), so the
recorder is always installed by then, and a worker, which loads the kernels and records nothing, never loads it."""

_record = None


def install(record):
    """Make `record` (ravop.record.graph.record) the recorder."""
    global _record
    _record = record


def record(opdef, inputs, params):
    """Record one op with the installed recorder: what `ravop.record.graph.record` does."""
    return _record(opdef, inputs, params)
