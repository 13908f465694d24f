"""Generate the user-facing `R.<name>` functions and `Op` methods/dunders from the op registry."""
from types import FunctionType

from ..core import registry
from ..core.registry import REQUIRED
from .frontends import FRONTENDS
from .graph import NO_PARAMS, Op, as_flag, canonical, record
from .op_signatures import op_signature



def make_function(opdef):
    """`fn(*tensors, *params, **kwargs)`: bind the call to the op's inputs and params, then record it."""
    n_inputs = len(opdef.inputs)
    input_names = opdef.inputs
    param_names = tuple(opdef.params)
    defaults = opdef.params
    required = tuple(k for k, v in defaults.items() if v is REQUIRED)
    variadic = opdef.variadic
    name = opdef.name
    flags = {k for k, v in defaults.items() if isinstance(v, bool)}
    fast = not variadic and not required

    def fn(*args, **kwargs):
        if fast and not kwargs and len(args) == n_inputs:   # the common call: its tensors, nothing else
            for t in args:
                if t is None:
                    break   # the full binding below names the missing input
            else:
                return record(opdef, args, dict(defaults) if defaults else NO_PARAMS)
        if variadic:
            if args and type(args[0]) is Op:  # tensors one by one, as the original's a.concat(b)
                count = next((i for i, a in enumerate(args) if type(a) is not Op), len(args))
                tensors, rest = args[:count], args[count:]
            elif args:
                tensors, rest = args[0], args[1:]
            else:
                tensors, rest = kwargs.pop(input_names[0]), ()
            if not isinstance(tensors, (list, tuple)) or not tensors:
                raise TypeError(f"{name}() takes a non-empty list of tensors, not {tensors!r}")
            tensors = tuple(tensors)
        else:
            tensors, rest = args[:n_inputs], args[n_inputs:]
            if len(tensors) < n_inputs:
                tensors = tensors + tuple(kwargs.pop(k, None) for k in input_names[len(tensors):])
            if any(t is None for t in tensors):  # not `None in`: Op.__eq__ records an op
                missing = [input_names[i] for i, t in enumerate(tensors) if t is None]
                if any(input_names.index(m) < opdef.n_required_inputs for m in missing):
                    raise TypeError(f"{name}() is missing tensor input(s): {', '.join(missing)}")
                tensors = tuple(t for t in tensors if t is not None)
        if not rest and not kwargs:
            if required:
                raise TypeError(f"{name}() is missing param(s): {', '.join(required)}")
            return record(opdef, tensors, dict(defaults) if defaults else NO_PARAMS)
        if len(rest) > len(param_names):
            raise TypeError(f"{name}() takes {n_inputs} tensor(s) and params {param_names}; got {len(args)} "
                            "positional arguments")
        params = dict(defaults)
        for key, value in zip(param_names, rest):
            params[key] = as_flag(value, key, name) if key in flags else canonical(value)
        for key, value in kwargs.items():
            if key not in defaults:
                raise TypeError(f"{name}() got an unexpected keyword argument {key!r}; "
                                f"params: {', '.join(param_names) or 'none'}")
            params[key] = as_flag(value, key, name) if key in flags else canonical(value)
        missing = [k for k in required if params[k] is REQUIRED]
        if missing:
            raise TypeError(f"{name}() is missing param(s): {', '.join(missing)}")
        return record(opdef, tensors, params)

    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = "ravop"  # pickle finds a model's loss function as `R.<name>`, which loads the API
    fn.__doc__ = opdef.doc
    fn.__signature__ = op_signature(opdef)   # inspect.signature(R.matmul), help() and IDEs: the op's own
    return fn


def _method(fn, signature=None):
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    method.__name__ = fn.__name__
    method.__doc__ = fn.__doc__
    method.__wrapped__ = fn   # inspect.signature follows it to the function's parameters
    if signature is not None:
        method.__signature__ = signature
    return method


def _dunder(opdef, reflected=False):
    """Dunders skip argument binding: their ops take tensors only and no params."""
    if len(opdef.inputs) == 1:
        def method(self):
            return record(opdef, (self,), NO_PARAMS)
    elif reflected:
        def method(self, other):
            return record(opdef, (other, self), NO_PARAMS)
    else:
        def method(self, other):
            return record(opdef, (self, other), NO_PARAMS)
    return method


# The Python operators whose reflected form (`2 + x`) swaps the operands; which op each one records is declared
# by the op (`OpDef.operators`).
REFLECTED = {"__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__rmatmul__", "__rpow__"}


def operators():
    """(dunder, OpDef) of every Python operator an op declares (`OpDef.operators`), the reflected ones last."""
    pairs = [(dunder, opdef) for opdef in registry.unique_opdefs() for dunder in opdef.operators]
    return sorted(pairs, key=lambda pair: pair[0] in REFLECTED)
_OP_ATTRIBUTES = set(dir(Op)) | set(Op.__slots__)


def build(namespace):
    """Put one function per registered name into `namespace` and attach methods and dunders to `Op`."""
    functions = {}
    for key, opdef in registry.REGISTRY.items():
        if opdef.name not in functions:
            functions[opdef.name] = FRONTENDS.get(opdef.name) or make_function(opdef)
        fn = functions[opdef.name]
        if opdef.internal:
            continue  # R.t makes constants, multi-output ops return their outputs, ravop.record.loop makes loops
        namespace[key] = fn
        if opdef.method and key not in _OP_ATTRIBUTES:   # a plain function binds as a method itself
            if opdef.variadic and fn is not FRONTENDS.get(opdef.name):   # x.concat(y, axis=0): the others
                setattr(Op, key, _method(fn, op_signature(opdef, method=True)))
            else:
                setattr(Op, key, fn if isinstance(fn, FunctionType) else _method(fn))
    for dunder, opdef in operators():
        if dunder in REFLECTED:
            setattr(Op, dunder, _dunder(opdef, reflected=True))
        else:
            setattr(Op, dunder, _method(functions[opdef.name]) if opdef.params else _dunder(opdef))
    Op.__hash__ = object.__hash__  # defining __eq__ above would otherwise make Ops unhashable
    return functions
