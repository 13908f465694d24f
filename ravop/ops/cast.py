"""`cast` (alias `astype`): a tensor converted to another dtype, as numpy's `x.astype('float32')`."""
from ..core import op_functions as R
from ..core.dtypes import NAMES, as_dtype, is_floating
from ..core.registry import REQUIRED, register


def _cast_shape(x, dtype):
    return x.shape, as_dtype(dtype)


def _cast_vjp(node, g, wants):
    source = node.inputs[0].dtype
    # A gradient flows back only between floating dtypes: integers and bools have none.
    return (R.cast(g, dtype=NAMES[source]) if is_floating(source) and is_floating(node.dtype) else None,)


@register("cast", params={"dtype": REQUIRED}, shape=_cast_shape, vjp=_cast_vjp, aliases=("astype",))
def cast(x, dtype):
    """`x` converted to `dtype` (a name such as 'float32', a torch dtype or a numpy dtype); floats to
    integers truncate toward zero, as numpy's astype."""
    return x.to(as_dtype(dtype))
