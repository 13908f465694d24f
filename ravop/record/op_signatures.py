"""The signature of a generated `R.<op>` function, made from its registry entry.

`ravop.record.api` sets it as the function's `__signature__` (so `inspect.signature(R.matmul)`, `help()` and IDEs that
ask the live object show the op's tensors and params, not `(*args, **kwargs)`), and scripts/gen_stubs.py writes
the same parameters into ravop/__init__.pyi. Annotations are strings naming the stub's types (`TensorLike`,
`Op`), which exist in the stub only.
"""
import inspect

from ..core.registry import REQUIRED

_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_VAR_POSITIONAL = inspect.Parameter.VAR_POSITIONAL
_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD


def _annotation(default):
    for kind in (bool, int, float, str):
        if type(default) is kind:
            return kind.__name__
    return "Any"


def _params(opdef, defaulted):
    """Params, positional or keyword; a required one after a defaulted one (or an optional tensor input) is
    keyword-only, which Python's syntax asks for."""
    out, keyword_only = [], False
    for name, default in opdef.params.items():
        if default is REQUIRED:
            keyword_only = keyword_only or defaulted
            out.append(inspect.Parameter(name, _KEYWORD if keyword_only else _POSITIONAL, annotation="Any"))
        else:
            out.append(inspect.Parameter(name, _KEYWORD if keyword_only else _POSITIONAL, default=default,
                                         annotation=_annotation(default)))
            defaulted = True
    return out


def op_signature(opdef, method=False):
    """`(tensors..., params...) -> Op`; for a method, `self` first (the first tensor input)."""
    if opdef.variadic:
        if method:   # x.concat(y, z, axis=0): the other tensors one by one, then params by keyword
            parameters = [inspect.Parameter("self", _POSITIONAL), inspect.Parameter("more", _VAR_POSITIONAL,
                                                                                     annotation="Any"),
                          inspect.Parameter("params", _VAR_KEYWORD, annotation="Any")]
            return inspect.Signature(parameters, return_annotation="Op")
        tensors = [inspect.Parameter(opdef.inputs[0], _POSITIONAL, annotation="Sequence[TensorLike]")]
        return inspect.Signature(tensors + _params(opdef, False), return_annotation="Op")
    tensors = []
    for i, name in enumerate(opdef.inputs):
        if i >= opdef.n_required_inputs:
            tensors.append(inspect.Parameter(name, _POSITIONAL, default=None, annotation="TensorLike | None"))
        else:
            tensors.append(inspect.Parameter(name, _POSITIONAL, annotation="TensorLike"))
    if method and tensors:
        tensors[0] = inspect.Parameter("self", _POSITIONAL)
    return inspect.Signature(tensors + _params(opdef, opdef.n_required_inputs < len(opdef.inputs)),
                             return_annotation="Op")
