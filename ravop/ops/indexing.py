"""numpy indexing as ops: `index` (x[...]), its adjoint `index_backward`, and `set_value` (x with x[...] = v).

The index is stored canonically (see `ravop.record.index_spec`); tensor indices are extra inputs after `x`.
Semantics are numpy's, including what torch does differently: an int next to array indices counts as an advanced
index (so the advanced dims go first when the advanced indices are not adjacent), and negative slice
steps work. `R.index(x, indices)`, `x[...]` and `R.set_value(x, value, indices)` are thin front ends
(ravop.record.frontends) that turn the user's index (or the original's string form, e.g. "[:,-1,:]") into the
canonical spec.
"""
import torch

from ..core.alignment import aligned
from ..core.dtypes import is_floating
from ..core.recorder import record
from ..core.registry import REQUIRED, get, register
from ..core.sizes import numel
from . import rules
from .graph_machinery import unbroadcast

# --------------------------------------------------------------------------------------- shape of x[...]


def _list_shape(values):
    shape = []
    while isinstance(values, tuple):
        shape.append(len(values))
        values = values[0] if values else None
    return tuple(shape)


def _flat(values):
    if isinstance(values, tuple):
        for v in values:
            yield from _flat(v)
    else:
        yield values


def _entries(spec, tensors):
    """Each spec item as (kind, data): kind is int, slice, new, ellipsis, array (int array: its shape)
    or mask (bool array: its shape, and its count of true values, -1 if unknown)."""
    tensors = iter(tensors)
    out = []
    for item in spec:
        if type(item) is int:
            out.append(("int", item))
        elif item[0] == "s":
            out.append(("slice", slice(*item[1:])))
        elif item[0] == "n":
            out.append(("new", None))
        elif item[0] == "e":
            out.append(("ellipsis", None))
        elif item[0] == "l":
            shape = _list_shape(item[1])
            flat = list(_flat(item[1]))
            if flat and all(type(v) is bool for v in flat):
                out.append(("mask", (shape, sum(flat))))
            else:
                out.append(("array", (shape, flat)))
        else:
            t = next(tensors)
            if t.dtype == torch.bool:
                if not t.shape:
                    raise IndexError("a 0-d bool index is not supported; use None to add an axis")
                out.append(("mask", (t.shape, -1)))
            elif is_floating(t.dtype):
                raise IndexError(f"tensor indices must be integer or bool, not {t.dtype}")
            elif t.shape:
                out.append(("array", (t.shape, None)))
            else:
                out.append(("int", None))  # a 0-d tensor acts as an int whose value is not known yet
    return out


def _consumed(kind, data):
    if kind == "mask":
        return len(data[0])
    return 0 if kind in ("new", "ellipsis") else 1


def _basic_shape(shape, spec):
    """index_shape for an index of ints and slices only (the common x[i], x[:, a:b]); None otherwise."""
    if len(spec) > len(shape):
        return None
    out = []
    for item, size in zip(spec, shape):
        if type(item) is int:
            if size >= 0 and not -size <= item < size:
                return None  # let the general path raise its error
        elif item[0] == "s" and size >= 0:
            out.append(len(range(*slice(item[1], item[2], item[3]).indices(size))))
        else:
            return None
    return tuple(out) + tuple(shape[len(spec):])


def index_shape(shape, spec, tensors):
    """numpy's result shape of x[index] for `x` of `shape`, with `tensors` the index's tensor inputs."""
    if not tensors:
        basic = _basic_shape(shape, spec)
        if basic is not None:
            return basic
    entries = _entries(spec, tensors)
    ndim = len(shape)
    used = sum(_consumed(k, d) for k, d in entries)
    if used > ndim:
        raise IndexError(f"too many indices for a {ndim}-d tensor: the index uses {used} dimensions")
    arrays = any(k == "mask" or k == "array" for k, _ in entries)
    out, advanced, adv_at, adv_items, dim = [], [], None, [], 0
    for position, (kind, data) in enumerate(entries):
        if kind == "new":
            out.append(1)
            continue
        if kind == "ellipsis":
            out.extend(shape[dim:dim + ndim - used])
            dim += ndim - used
            continue
        size = shape[dim]
        if kind == "slice":
            out.append(len(range(*data.indices(size))) if size >= 0 else -1)
        elif kind == "int":
            if data is not None and size >= 0 and not -size <= data < size:
                raise IndexError(f"index {data} is out of bounds for axis {dim} of size {size}")
            if arrays:  # numpy: an int among array indices is a 0-d advanced index
                advanced.append(())
                adv_items.append(position)
        elif kind == "array":
            array_shape, values = data
            if values and size >= 0:
                bad = [v for v in values if not -size <= v < size]
                if bad:
                    raise IndexError(f"index {bad[0]} is out of bounds for axis {dim} of size {size}")
            advanced.append(tuple(array_shape))
            adv_items.append(position)
        else:  # mask
            mask_shape, count = data
            covered = shape[dim:dim + len(mask_shape)]
            if any(a != b and -1 not in (a, b) for a, b in zip(mask_shape, covered)):
                raise IndexError(f"bool index of shape {tuple(mask_shape)} does not match the indexed "
                                 f"dimensions {tuple(covered)}")
            advanced.append((count,))
            adv_items.append(position)
        if kind in ("array", "mask") or kind == "int" and arrays:
            if adv_at is None:
                adv_at = len(out)
        dim += _consumed(kind, data)
    out.extend(shape[dim:])
    if not advanced:
        return tuple(out)
    group = list(rules.broadcast_all(*advanced))
    adjacent = adv_items == list(range(adv_items[0], adv_items[0] + len(adv_items)))
    at = adv_at if adjacent else 0
    return tuple(out[:at] + group + out[at:])


# ---------------------------------------------------------------------------------- kernel side of x[...]

def torch_index(spec, tensors, device):
    """The spec as a tuple of torch index items (index lists on `device`, the indexed tensor's), with numpy's
    meaning except for negative slice steps."""
    tensors = iter(tensors)
    items = []
    for item in spec:
        if type(item) is int:
            items.append(item)
        elif item[0] == "s":
            items.append(slice(*item[1:]))
        elif item[0] == "n":
            items.append(None)
        elif item[0] == "e":
            items.append(Ellipsis)
        elif item[0] == "l":
            items.append(torch.tensor(item[1], device=device) if item[1] else
                         torch.zeros(0, dtype=torch.int64, device=device))
        else:
            t = next(tensors)
            items.append(t if t.dtype == torch.bool else t.long())
    if any(isinstance(i, torch.Tensor) and (i.dim() or i.dtype == torch.bool) for i in items):
        # numpy treats ints among array indices as 0-d arrays; torch only does so for 1-d tensors
        items = [torch.tensor([i], device=device) if type(i) is int else
                 i.reshape(1) if isinstance(i, torch.Tensor) and not i.dim() else i for i in items]
    return items


def _dims_used(item):
    if item is None or item is Ellipsis:
        return 0
    return item.dim() if isinstance(item, torch.Tensor) and item.dtype == torch.bool else 1


def apply_index(x, spec, tensors):
    """x[index] with numpy semantics (a view where torch gives one).

    torch slices need a positive step, so x[a:b:-s] becomes x.flip(d)[a':b':s] with mirrored bounds."""
    items = torch_index(spec, tensors, x.device)
    flips, dim = [], 0
    for k, item in enumerate(items):
        if item is Ellipsis:
            dim += x.dim() - sum(_dims_used(i) for i in items)
        elif isinstance(item, slice) and item.step is not None and item.step < 0:
            start, stop, step = item.indices(x.shape[dim])
            count = len(range(start, stop, step))
            first = x.shape[dim] - 1 - start
            items[k] = slice(first, first + (count - 1) * -step + 1, -step) if count else slice(0, 0)
            flips.append(dim)
        dim += _dims_used(item)
    return (x.flip(flips) if flips else x)[tuple(items)]


def positions(shape, spec, tensors, device):
    """The flat positions in a tensor of `shape` that x[index] reads, shaped like x[index]."""
    return apply_index(torch.arange(numel(shape), device=device).reshape(shape), spec, tensors)


# ----------------------------------------------------------------------------------------------- the ops

def _index_shape(x, *tensors, spec):
    return index_shape(x.shape, spec, tensors), x.dtype


def _index_vjp(node, g, wants):
    x, *tensors = node.inputs
    spec = node.params["spec"]
    grad = record(get("index_backward"), (g, *tensors), {"spec": spec, "shape": x.shape})
    return (grad,) + (None,) * len(tensors)


@register("index", inputs=("*xs",), params={"spec": REQUIRED}, operators=("__getitem__",), shape=_index_shape,
          vjp=_index_vjp)
def index_kernel(x, *tensors, spec):
    """x[index] with numpy semantics. `R.index(x, indices)` or `x[...]` takes ints, slices, None, ...,
    lists and int/bool tensors, or the original's string form "[:, -1, 1:3]" (parsed, never evaluated).
    A bool mask gives a dimension whose size is known only when the op runs."""
    return aligned(apply_index(x, spec, tensors))


def _index_backward_shape(g, *tensors, spec, shape):
    picked = index_shape(tuple(shape), spec, tensors)
    if len(picked) != len(g.shape) or any(a != b and -1 not in (a, b) for a, b in zip(picked, g.shape)):
        raise ValueError(f"a gradient of shape {g.shape} does not fit x[index] of shape {picked}")
    return tuple(shape), g.dtype


def _index_backward_vjp(node, g, wants):
    _, *tensors = node.inputs
    return (record(get("index"), (g, *tensors), {"spec": node.params["spec"]}),) + (None,) * len(tensors)


@register("index_backward", inputs=("*xs",), params={"spec": REQUIRED, "shape": REQUIRED},
          shape=_index_backward_shape, vjp=_index_backward_vjp, method=False)
def index_backward(g, *tensors, spec, shape):
    """Zeros of `shape` with `g` added at x[index] (repeated positions accumulate): the VJP of `index`."""
    where = positions(tuple(shape), spec, tensors, g.device)
    out = torch.zeros(numel(shape), dtype=g.dtype, device=g.device)
    out.index_add_(0, where.reshape(-1), g.reshape(-1))
    return out.reshape(tuple(shape))


# ------------------------------------------------------------------------------------------- set_value

def _set_value_shape(x, value, *tensors, spec):
    target = index_shape(x.shape, spec, tensors)
    try:
        fits = rules.broadcast(value.shape, target) == target
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"a value of shape {value.shape} cannot be assigned to x[index] of shape {target}")
    return x.shape, x.dtype


def _set_value_vjp(node, g, wants):
    x, value, *tensors = node.inputs
    spec = {"spec": node.params["spec"]}
    g_x = record(get("set_value"), (g, 0.0, *tensors), spec)
    g_value = unbroadcast(record(get("index"), (g, *tensors), spec), value)
    return (g_x, g_value) + (None,) * len(tensors)


@register("set_value", inputs=("*xs",), params={"spec": REQUIRED}, shape=_set_value_shape, vjp=_set_value_vjp)
def set_value_kernel(x, value, *tensors, spec):
    """A copy of `x` with x[index] = value (value broadcast, cast to x's dtype); x is not modified.
    `R.set_value(x, value, indices)` takes the same indices as `index`. Where an index repeats a
    position, the last write wins (as in numpy) and the value's gradient counts every write."""
    where = positions(tuple(x.shape), spec, tensors, x.device)
    out = x.clone(memory_format=torch.contiguous_format)
    out.view(-1)[where.reshape(-1)] = value.to(x.dtype).expand(where.shape).reshape(-1)
    return out
