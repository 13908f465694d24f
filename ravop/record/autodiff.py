"""Reverse-mode autodiff over the recorded graph: `R.grad(loss, wrt)` records the backward pass as ops.

Node ids are positions in the append-only op table, so every input has a smaller id than its reader: the
table itself is a topological order and no sort is needed. One forward scan over the ids between the first
`wrt` and `loss` marks the nodes that depend on a `wrt`; one backward scan over the same ids calls the VJP
rule (`OpDef.vjp`) of each marked node that received a gradient from `loss`. So only nodes on a path from a
`wrt` to `loss` are differentiated, and the cost is linear in the size of that stretch of the graph.

Gradients follow torch's rules: a value used several times gets the sum of its readers' gradients; an
integer or bool value (comparisons, argmax, indices) carries no gradient, so paths through it stop there;
a multi-output node's VJP gets one gradient per output (`None` for an output nothing differentiable read).
A `wrt` that `loss` does not depend on gets zeros of its shape and dtype (not `None`), so an optimizer step
can always consume the result.
"""
import torch

from ..core import op_functions as R
from ..core import registry
from ..core.dtypes import is_floating
from ..core.errors import RavopError
from .graph import Op, to_tensor
from .source import user_source


class NotDifferentiableError(RavopError, TypeError):
    """An op on the path from a `wrt` to the loss has no VJP rule."""


def grad(loss, wrt, grad_output=None):
    """Record d(loss)/d(wrt) as ops and return them: one Op, or a list/tuple shaped like `wrt`.

    `loss` must be a float scalar unless `grad_output` (an Op or tensor of loss's shape) gives the
    cotangent to start from. A `wrt` that `loss` does not depend on gets zeros of its shape."""
    if not isinstance(loss, Op):
        raise TypeError(f"grad: loss must be an Op, not {type(loss).__name__}")
    single = isinstance(wrt, Op)
    targets = [wrt] if single else list(wrt)
    for w in targets:
        if not isinstance(w, Op):
            raise TypeError(f"grad: wrt must be an Op or a list of Ops, not {w!r}")
        if w.graph is not loss.graph:
            raise ValueError(f"grad: {w!r} belongs to another graph than the loss")
        if isinstance(w.dtype, tuple) or not is_floating(w.dtype):
            raise TypeError(f"grad: wrt must be floating-point tensors (integers carry no gradient), not {w!r}")
    if isinstance(loss.dtype, tuple) or not is_floating(loss.dtype):
        raise TypeError(f"grad: loss must be one floating-point tensor, not {loss!r}")
    seed = _seed(loss, grad_output)
    if not targets:
        return type(wrt)()

    graph = loss.graph
    nodes = graph.nodes
    wrt_ids = {w.id for w in targets}
    first = min(wrt_ids)
    marked = _depends_on(nodes, wrt_ids, first, loss.id)

    found = _backward(nodes, marked, wrt_ids, first, loss.id, seed)
    grads = [found[w.id] if w.id in found else _zeros(w) for w in targets]
    if single:
        return grads[0]
    return tuple(grads) if isinstance(wrt, tuple) else grads


def _seed(loss, grad_output):
    if grad_output is None:
        if loss.shape != ():
            raise ValueError(f"grad: loss has shape {loss.shape}, not a scalar; pass grad_output= (the "
                             "cotangent of loss's shape) or reduce it first (R.sum / R.mean)")
        return loss.graph.constant(torch.ones((), dtype=loss.dtype), user_source())
    seed = grad_output if isinstance(grad_output, Op) else loss.graph.constant(to_tensor(grad_output),
                                                                                 user_source())
    if tuple(seed.shape) != tuple(loss.shape):
        raise ValueError(f"grad: grad_output has shape {seed.shape}, loss has shape {loss.shape}")
    return seed


def _depends_on(nodes, wrt_ids, first, last):
    """Ids in [first, last] of the `wrt` nodes and of the differentiable values computed from them."""
    marked = set(wrt_ids)
    for node in nodes[first + 1:last + 1]:
        if node.id in marked:
            continue
        for i in node.inputs:
            if i.id in marked:
                if _carries_grad(node.dtype):
                    marked.add(node.id)
                break
    return marked


def _carries_grad(dtype):
    if type(dtype) is tuple:
        return any(is_floating(d) for d in dtype)
    return is_floating(dtype)


def _backward(nodes, marked, wrt_ids, first, last, seed):
    """Walk ids from `last` down to `first`, calling each marked node's VJP; return {wrt id: grad Op}."""
    def wants(op):
        """Whether a gradient w.r.t. `op` is needed: a VJP may skip work for the others, as torch's
        `ctx.needs_input_grad` allows (e.g. a first layer's gradient w.r.t. the data batch)."""
        return op.id in marked

    pending = {last: seed}   # node id -> gradient Op (a list of Op | None for a multi-output node)
    found = {}
    for index in range(last, first - 1, -1):
        g = pending.pop(index, None)
        if g is None:
            continue
        if index in wrt_ids:
            found[index] = g
        node = nodes[index]
        if node.op in registry.PROJECTIONS:
            _gather_output(pending, node, g)
            continue
        if not node.inputs or index not in marked:
            continue
        opdef = registry.REGISTRY[node.op]
        if opdef.vjp is None:
            raise NotDifferentiableError(
                f"grad: op {node.op!r} (recorded at {node.source}) has no VJP rule, and the loss depends on "
                "a wrt through it; take the gradient w.r.t. its output instead, or cut the path")
        input_grads = opdef.vjp(node, g, wants)
        if len(input_grads) != len(node.inputs):
            raise RuntimeError(f"VJP of {node.op!r} returned {len(input_grads)} gradients for "
                               f"{len(node.inputs)} inputs")
        for inp, gi in zip(node.inputs, input_grads):
            if gi is None or inp.id not in marked:
                continue
            _check_shape(node, inp, gi)
            old = pending.get(inp.id)
            pending[inp.id] = gi if old is None else R.add(old, gi)
    return found


def _gather_output(pending, node, g):
    """A multi-output node's gradient is a list, one slot per output, summed over its tuple_get readers."""
    source = node.inputs[0]
    slots = pending.get(source.id)
    if slots is None:
        slots = pending[source.id] = [None] * len(source.dtype)
    i = node.params[registry.PICKS]
    slots[i] = g if slots[i] is None else R.add(slots[i], g)


def _check_shape(node, inp, g):
    """Catch a wrong VJP rule where it is recorded, not as a shape error deep inside a later op."""
    if g.shape == inp.shape:
        return
    if len(g.shape) == len(inp.shape) and all(a == b or a == -1 or b == -1 for a, b in zip(g.shape, inp.shape)):
        return  # -1 is a data-dependent dimension: it matches any size
    raise RuntimeError(f"VJP of {node.op!r} (recorded at {node.source}) gave a gradient of shape {g.shape} "
                       f"for an input of shape {inp.shape}")


def _zeros(w):
    """Zeros shaped like `w`: one 0-d constant broadcast, so nothing of w's size is stored or uploaded."""
    zero = w.graph.constant(torch.zeros((), dtype=w.dtype), user_source())
    return R.broadcast_to(zero, shape=w.shape)
