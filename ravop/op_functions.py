"""Namespace of the generated op functions (`R.add`, `R.sum`, ...), filled by `ravop.api.build`.

VJP rules record their backward ops through it (ops code imports it as `R`, and `F` is torch.nn.functional);
`import ravop as R` re-exports the same functions.
"""


def __getattr__(name):
    # A name looked up before `import ravop as R` loaded its API (`pickle.load` of a model in a fresh process finds
    # its loss function here): loading the API fills this namespace.
    if not name.startswith("__"):
        from . import requester  # noqa: F401
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
