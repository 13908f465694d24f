"""ravop: record lazy tensor ops, compile them to subgraphs and run them on workers through Redis.

    import ravop as R
    R.initialize()
    R.Graph(name='demo')
    c = R.t([1, 2, 3]) + R.t([4, 5, 6])
    c.persist_op('c')
    R.activate(); R.execute(); R.track_progress()
    R.fetch_persisting_op('c')

The names of `R` (ravop/client/requester.py) load on first use (PEP 562), so that a worker, which imports
ravop.core.registry, ravop.ops, ravop.store and ravop.wire, does not load sessions, recording and `R.model`.
"""
import importlib
import importlib.util


def _load_requester():
    names = importlib.import_module(f"{__name__}.client.requester").PUBLIC
    globals().update(names)
    return names


def __getattr__(name):
    if name == "__all__":   # `from ravop import *`
        return sorted(_load_requester())
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # A submodule's name is not an API name (`R.parallel`, `R.store`): it imports the submodule alone, not the whole
    # API.
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    names = _load_requester()
    if name not in names:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return names[name]


def __dir__():
    return sorted(set(globals()) | set(_load_requester()))
