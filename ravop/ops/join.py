"""Ops that join tensors or cut and extend them: concat stack split join_to_list combine_to_list tile repeat
slice pad. numpy semantics (mixed dtypes promote); `split` has several outputs."""
import torch

from ..core import op_functions as R
from ..core.alignment import aligned
from ..core.dtypes import result_dtype
from ..core.registry import REQUIRED, register
from ..core.sizes import numel
from . import rules, scriptable


def _promoted(shapes_dtypes):
    dtype = shapes_dtypes[0].dtype
    for x in shapes_dtypes[1:]:
        dtype = result_dtype(dtype, 1, x.dtype, 1)
    return dtype


def _cast_all(xs):
    dtype = xs[0].dtype
    for x in xs[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    return [x.to(dtype) for x in xs]


# ----------------------------------------------------------------------------------------------- split

def split_points(size, sections):
    """numpy.split's cut points along a dimension of `size`: an int N gives N equal parts (N must divide
    `size`), a sequence gives the indices where each part after the first starts."""
    if isinstance(sections, int):
        if sections <= 0:
            raise ValueError(f"split into {sections} parts: the number of parts must be positive")
        if size >= 0 and size % sections:
            raise ValueError(f"cannot split a dimension of size {size} into {sections} equal parts")
        if size < 0:
            raise ValueError("cannot split a dimension of unknown size into equal parts; give split points")
        return tuple(size // sections * i for i in range(1, sections))
    points = tuple(sections)
    if any(type(p) is not int for p in points):
        raise ValueError(f"split points must be ints, not {points}")
    return points


def _bounds(size, points):
    """(start, stop) of each part, clipped to the dimension as Python slicing does."""
    edges = [0, *points, size]
    clip = [e if size < 0 else min(max(e, 0), size) for e in edges]
    return [(clip[i], max(clip[i + 1], clip[i])) for i in range(len(edges) - 1)]


def _split_shape(x, numOrSizeSplits, axis=0):
    a = rules.normalize_axis(axis, len(x.shape))
    if not x.shape:
        raise ValueError("cannot split a 0-d tensor")
    size = x.shape[a]
    if size < 0:
        raise ValueError("cannot split a dimension of unknown size")
    parts = _bounds(size, split_points(size, numOrSizeSplits))
    return [(x.shape[:a] + (stop - start,) + x.shape[a + 1:], x.dtype) for start, stop in parts]


def _split_vjp(node, grads, wants):
    axis = node.params["axis"]
    parts = [g if g is not None else R.zeros(shape=shape, dtype=dtype)
             for g, shape, dtype in zip(grads, node.shape, node.dtype)]
    return (R.concat(parts, axis=axis),)


@register("split", params={"numOrSizeSplits": REQUIRED, "axis": 0}, shape=_split_shape, vjp=_split_vjp)
def split(x, numOrSizeSplits, axis=0):
    """numpy.split: `numOrSizeSplits` N cuts `axis` into N equal parts, a list of indices cuts it at
    those points. Returns one tensor per part (R.split returns a tuple of Ops)."""
    size = x.shape[axis]
    return tuple(aligned(x.narrow(axis, start, stop - start))
                 for start, stop in _bounds(size, split_points(size, numOrSizeSplits)))


# ---------------------------------------------------------------------------------------------- concat

def _concat_shape(*xs, axis=0):
    if axis is None:
        return (sum(numel(x.shape) for x in xs),), _promoted(xs)
    first = xs[0].shape
    if not first:
        raise ValueError("cannot concatenate 0-d tensors (use stack, or axis=None)")
    a = rules.normalize_axis(axis, len(first))
    for x in xs[1:]:
        if len(x.shape) != len(first) or any(p != q and i != a and -1 not in (p, q)
                                               for i, (p, q) in enumerate(zip(first, x.shape))):
            raise ValueError(f"concat along axis {a}: shapes {first} and {x.shape} differ off that axis")
    sizes = [x.shape[a] for x in xs]
    total = -1 if -1 in sizes else sum(sizes)
    return first[:a] + (total,) + first[a + 1:], _promoted(xs)


def _concat_vjp(node, g, wants):
    xs, axis = node.inputs, node.params["axis"]
    sizes = [numel(x.shape) if axis is None else x.shape[axis] for x in xs]
    points = [sum(sizes[:i]) for i in range(1, len(sizes))]
    parts = R.split(g, numOrSizeSplits=points, axis=0 if axis is None else axis)
    if axis is None:
        return tuple(R.reshape(p, shape=x.shape) for p, x in zip(parts, xs))
    return parts


@register("concat", inputs=("*xs",), params={"axis": 0}, shape=_concat_shape, vjp=_concat_vjp,
          aliases=("concatenate",), torch_function=(scriptable.concat, scriptable.same_params))
def concat(*xs, axis=0):
    """Join tensors along an existing axis (numpy.concatenate; axis=None joins them flattened)."""
    xs = _cast_all(xs)
    if axis is None:
        return torch.cat([x.reshape(-1) for x in xs])
    return torch.cat(xs, dim=axis)


def _stack_shape(*xs, axis=0):
    first = xs[0].shape
    for x in xs[1:]:
        if x.shape != first:
            raise ValueError(f"stack needs tensors of one shape, got {first} and {x.shape}")
    a = rules.normalize_axis(axis, len(first) + 1)
    return first[:a] + (len(xs),) + first[a:], _promoted(xs)


def _stack_vjp(node, g, wants):
    xs = node.inputs
    axis = rules.normalize_axis(node.params["axis"], len(xs[0].shape) + 1)
    parts = R.split(g, numOrSizeSplits=len(xs), axis=axis)
    return tuple(R.reshape(p, shape=x.shape) for p, x in zip(parts, xs))


@register("stack", inputs=("*xs",), params={"axis": 0}, shape=_stack_shape, vjp=_stack_vjp)
def stack(*xs, axis=0):
    """Join tensors of one shape along a new axis (numpy.stack)."""
    return torch.stack(_cast_all(xs), dim=axis)


def _join_vjp(node, g, wants):
    a, b = node.inputs
    ga, gb = R.split(g, numOrSizeSplits=(numel(a.shape),))
    return R.reshape(ga, shape=a.shape), R.reshape(gb, shape=b.shape)


@register("join_to_list", inputs=("a", "b"), vjp=_join_vjp,
          shape=lambda a, b: ((numel(a.shape) + numel(b.shape),), _promoted((a, b))))
def join_to_list(a, b):
    """numpy.append(a, b): both flattened, b's elements after a's."""
    a, b = _cast_all((a, b))
    return torch.cat([a.reshape(-1), b.reshape(-1)])


def _combine_vjp(node, g, wants):
    a, b = node.inputs
    ga, gb = R.split(g, numOrSizeSplits=2)
    return R.reshape(ga, shape=a.shape), R.reshape(gb, shape=b.shape)


@register("combine_to_list", inputs=("a", "b"), shape=lambda a, b: _stack_shape(a, b), vjp=_combine_vjp)
def combine_to_list(a, b):
    """numpy.array([a, b]): two tensors of one shape stacked along a new first axis."""
    return torch.stack(_cast_all((a, b)))


# ---------------------------------------------------------------------------------------- tile, repeat

def _reps(reps):
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    if any(not isinstance(r, int) or r < 0 for r in reps):
        raise ValueError(f"tile reps must be non-negative ints, not {reps}")
    return reps


def _tile_shape(x, reps):
    reps = _reps(reps)
    n = max(len(reps), len(x.shape))
    reps = (1,) * (n - len(reps)) + reps
    shape = (1,) * (n - len(x.shape)) + x.shape
    return tuple(-1 if s < 0 else s * r for s, r in zip(shape, reps)), x.dtype


def _tile_vjp(node, g, wants):
    x = node.inputs[0]
    reps = _reps(node.params["reps"])
    n = max(len(reps), len(x.shape))
    reps = (1,) * (n - len(reps)) + reps
    shape = (1,) * (n - len(x.shape)) + x.shape
    # The output along each dim is r copies of s elements: sum the copies.
    interleaved = R.reshape(g, shape=tuple(v for pair in zip(reps, shape) for v in pair))
    summed = R.sum(interleaved, axis=tuple(range(0, 2 * n, 2)))
    return (R.reshape(summed, shape=x.shape),)


@register("tile", params={"reps": REQUIRED}, shape=_tile_shape, vjp=_tile_vjp)
def tile(x, reps):
    """Repeat the whole tensor `reps` times along each dim (numpy.tile; reps and x's dims are aligned
    from the right, missing ones count as 1)."""
    return torch.tile(x, _reps(reps))


def _repeats(repeats, size):
    if isinstance(repeats, int):
        if repeats < 0:
            raise ValueError(f"repeats must be non-negative, not {repeats}")
        return None
    repeats = tuple(repeats)
    if any(not isinstance(r, int) or r < 0 for r in repeats):
        raise ValueError(f"repeats must be non-negative ints, not {repeats}")
    if len(repeats) != 1 and size >= 0 and len(repeats) != size:
        raise ValueError(f"{len(repeats)} repeats for a dimension of size {size}")
    return repeats


def _repeat_shape(x, repeats, axis=None):
    if axis is None:
        size, shape, a = numel(x.shape), (numel(x.shape),), 0
    else:
        a = rules.normalize_axis(axis, len(x.shape))
        size, shape = x.shape[a], x.shape
    listed = _repeats(repeats, size)
    if size < 0:
        total = -1
    elif listed is None or len(listed) == 1:
        total = size * (repeats if listed is None else listed[0])
    else:
        total = sum(listed)
    return shape[:a] + (total,) + shape[a + 1:], x.dtype


def _repeat_vjp(node, g, wants):
    x = node.inputs[0]
    repeats, axis = node.params["repeats"], node.params["axis"]
    size = numel(x.shape) if axis is None else x.shape[axis]
    counts = torch.tensor(repeats if isinstance(repeats, int) else tuple(repeats), dtype=torch.int64)
    sources = torch.repeat_interleave(torch.arange(size), counts)  # output position -> input position
    return (R.gather_backward(g, sources, axis=axis, shape=x.shape),)


@register("repeat", params={"repeats": REQUIRED, "axis": None}, shape=_repeat_shape, vjp=_repeat_vjp)
def repeat(x, repeats, axis=None):
    """Repeat each element `repeats` times along `axis` (numpy.repeat; axis=None repeats the flattened
    elements; `repeats` may list one count per element)."""
    counts = repeats if isinstance(repeats, int) else torch.tensor(tuple(repeats), device=x.device)
    return torch.repeat_interleave(x, counts, dim=axis)


# ----------------------------------------------------------------------------------------------- slice

def _slice_bounds(shape, begin, size):
    begin = (begin,) if isinstance(begin, int) else tuple(begin)
    size = (size,) if isinstance(size, int) else tuple(size)
    if len(begin) != len(size) or len(begin) > len(shape):
        raise ValueError(f"slice begin {begin} and size {size} must name the same leading dims of a "
                         f"{len(shape)}-d tensor")
    out = []
    for d, (b, s, n) in enumerate(zip(begin, size, shape)):
        if n < 0:  # a size known only when the op runs: the kernel checks the bounds then
            if b < 0 or s < -1:
                raise ValueError(f"slice begin {b} size {s} does not fit dimension {d}")
            out.append((b, -1 if s == -1 else b + s))
            continue
        stop = n if s == -1 else b + s
        if not 0 <= b <= n or s < -1 or stop > n:
            raise ValueError(f"slice begin {b} size {s} does not fit dimension {d} of size {n}")
        out.append((b, stop))
    return out


def _slice_shape(x, begin, size):
    bounds = _slice_bounds(x.shape, begin, size)
    return tuple(-1 if stop < 0 else stop - b for b, stop in bounds) + x.shape[len(bounds):], x.dtype


def _slice_vjp(node, g, wants):
    x = node.inputs[0]
    bounds = _slice_bounds(x.shape, node.params["begin"], node.params["size"])
    widths = tuple((b, n - stop) for (b, stop), n in zip(bounds, x.shape)) + ((0, 0),) * (len(x.shape) - len(bounds))
    return (R.pad(g, sequence=widths),)


@register("slice", params={"begin": REQUIRED, "size": REQUIRED}, shape=_slice_shape, vjp=_slice_vjp)
def slice_(x, begin, size):
    """The block starting at `begin` with `size` elements (x[begin:begin+size] along the first axis, as
    the original; sequences give one begin/size per leading dim, as tf.slice; size -1 runs to the end)."""
    for d, (b, stop) in enumerate(_slice_bounds(x.shape, begin, size)):
        x = x.narrow(d, b, stop - b)
    return aligned(x)


# ------------------------------------------------------------------------------------------------- pad

PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def pad_widths(sequence, ndim):
    """numpy's pad_width: an int, (pad,), (before, after), or one (before, after) per dim."""
    if isinstance(sequence, int):
        sequence = ((sequence, sequence),)
    sequence = tuple(sequence)
    if sequence and all(isinstance(v, int) for v in sequence):
        if len(sequence) not in (1, 2):
            raise ValueError(f"pad widths {sequence}: give an int, (before, after) or one pair per dim")
        sequence = (sequence * (3 - len(sequence)),)
    pairs = tuple(tuple(p) * (3 - len(tuple(p))) for p in sequence)
    if len(pairs) == 1:
        pairs = pairs * ndim
    if len(pairs) != ndim or any(len(p) != 2 or not all(isinstance(v, int) and v >= 0 for v in p)
                                 for p in pairs):
        raise ValueError(f"pad widths {sequence} must be non-negative (before, after) pairs for {ndim} dims")
    return pairs


def _pad_shape(x, sequence, mode="constant", constant_values=0):
    if mode not in PAD_MODES:
        raise ValueError(f"pad mode {mode!r} is not one of {', '.join(PAD_MODES)}")
    pairs = pad_widths(sequence, len(x.shape))
    for d, ((before, after), n) in enumerate(zip(pairs, x.shape)):
        if mode != "constant" and n == 0 and before + after:
            raise ValueError(f"pad mode {mode!r} cannot extend the empty dimension {d}")
    return tuple(-1 if n < 0 else before + n + after for (before, after), n in zip(pairs, x.shape)), x.dtype


def _source(mode, n, before, after):
    """For each output position along one dim, the input position it copies (non-constant modes)."""
    i = torch.arange(-before, n + after)
    if mode == "edge":
        return i.clamp(0, n - 1)
    if mode == "wrap":
        return i.remainder(n)
    if mode == "reflect":
        if n == 1:
            return torch.zeros_like(i)
        j = i.remainder(2 * n - 2)
        return torch.where(j < n, j, 2 * n - 2 - j)
    j = i.remainder(2 * n)  # symmetric: the edge element is repeated
    return torch.where(j < n, j, 2 * n - 1 - j)


def _pad_vjp(node, g, wants):
    x = node.inputs[0]
    p = node.params
    return (R.pad_backward(g, sequence=pad_widths(p["sequence"], len(x.shape)), mode=p["mode"], shape=x.shape),)


@register("pad", params={"sequence": REQUIRED, "mode": "constant", "constant_values": 0}, shape=_pad_shape,
          vjp=_pad_vjp)
def pad(x, sequence, mode="constant", constant_values=0):
    """numpy.pad: `sequence` is the pad width (an int, (before, after), or one pair per dim); modes
    'constant' (filled with `constant_values`), 'edge', 'reflect', 'symmetric' and 'wrap'."""
    pairs = pad_widths(sequence, x.dim())
    if mode == "constant":
        flat = [v for before_after in reversed(pairs) for v in before_after]  # torch lists the last dim first
        return torch.nn.functional.pad(x, flat, value=constant_values) if any(flat) else x
    for d, (before, after) in enumerate(pairs):
        if before or after:
            x = torch.index_select(x, d, _source(mode, x.shape[d], before, after).to(x.device))
    return x


def _pad_backward_shape(g, sequence, mode, shape):
    padded, _ = _pad_shape(rules.Like(shape, g.dtype), sequence, mode)
    if padded != g.shape:
        raise ValueError(f"a gradient of shape {g.shape} does not fit padding {tuple(shape)} "
                         f"to {padded}")
    return tuple(shape), g.dtype


@register("pad_backward", params={"sequence": REQUIRED, "mode": "constant", "shape": REQUIRED}, method=False,
          shape=_pad_backward_shape,
          vjp=lambda node, g, wants: (R.pad(g, sequence=node.params["sequence"], mode=node.params["mode"]),))
def pad_backward(g, sequence, mode="constant", shape=REQUIRED):
    """The VJP of `pad`: the gradient of the padded output folded back onto the input of `shape`
    (cropped for 'constant', summed over every copy for the other modes). `sequence` is per-dim pairs."""
    if mode == "constant":
        for d, ((before, _), n) in enumerate(zip(sequence, shape)):
            g = g.narrow(d, before, n)
        return aligned(g)
    for d in reversed(range(len(shape))):
        before, after = sequence[d]
        if before or after:
            n = shape[d]
            out = torch.zeros(g.shape[:d] + (n,) + g.shape[d + 1:], dtype=g.dtype, device=g.device)
            g = out.index_add_(d, _source(mode, n, before, after).to(g.device), g)
    return g
