"""Run ops with their registry kernels: the one interpreter loop, used by workers, constant folding and
in-process evaluation (`evaluate`, for tests and debugging).

Random ops draw from a host `torch.Generator` seeded by `op_seed(graph_seed, node_id)`, so a value is the
same whichever worker (CPU or GPU) computes it and however often it is retried. A kernel that raises is
reported as an `OpError` naming its node (as torch.fx's Interpreter does), the same on a worker and in
`evaluate`.
"""
import torch

from . import registry
from .errors import RavopError
from .node import Node

_MASK = (1 << 64) - 1


class OpError(RavopError, RuntimeError):
    """An op's kernel raised: `node` is the op (`.op`, `.source`: the user's line), `detail` the kernel's error
    in one line; the kernel's exception is the `__cause__`."""

    def __init__(self, node, detail):
        source = getattr(node, "source", "")
        super().__init__(f"op {node.op!r}{f' (recorded at {source})' if source else ''}: {detail}")
        self.node, self.detail = node, detail


def describe(exc, node):
    """`exc` in one line; one that carries no message (a bare StopIteration from odd params) says so."""
    text = str(exc).strip()
    if text:
        return f"{type(exc).__name__}: {text}"
    params = ", ".join(f"{k}={v!r}" for k, v in node.params.items()) or "no params"
    return f"{type(exc).__name__} with no message, raised by the kernel with {params[:300]}"


def op_seed(graph_seed, node_id):
    """A 63-bit seed for one op (splitmix64 of the graph seed and the node id: stable across processes)."""
    z = (int(graph_seed) * 0x9E3779B97F4A7C15 + int(node_id) + 1) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) >> 1


def run_op(opdef, args, params, graph_seed=0, node_id=0, device="cpu"):
    """Apply one op's kernel to tensors (`args`, on `device`) with its params; the result is on `device`.

    The device comes from here for every op (ravop/registry.py, "Devices"): an op that makes tensors from
    params alone runs with `device` as torch's default device; a random op draws on a host generator, so a
    CPU and a GPU worker draw the same numbers, and its result is moved. Other kernels follow their inputs,
    so they run without torch's device mode, which would add Python work to every torch call they make."""
    if opdef.random:
        generator = torch.Generator().manual_seed(op_seed(graph_seed, node_id))
        out = opdef.kernel(*args, generator=generator, **params)
        return out if device == "cpu" else _to(out, device)
    if opdef.creates and device != "cpu":
        with torch.device(device):
            return opdef.kernel(*args, **params)
    return opdef.kernel(*args, **params)


def _to(out, device):
    if isinstance(out, (tuple, list)):
        return type(out)(_to(o, device) for o in out)
    return out.to(device)


def run_nodes(nodes, env, graph_seed=0, device="cpu", last_use=None, check=None):
    """Run `nodes` (objects with .id .op .inputs(ids) .params .source) in order on `device` (its inputs in `env`
    are there already); `env` maps node id -> value and must hold every input from outside. With `last_use`
    (id -> index of its last reader), values are dropped from `env` after their last use, except ids not in
    `last_use` (the outputs). `check(node, value)`, if given, sees each value as it is made and may raise.
    A kernel that raises becomes an `OpError` naming its node; the failing op's inputs are still in `env`."""
    device = str(device)
    for index, node in enumerate(nodes):
        opdef = registry.REGISTRY[node.op]
        try:
            value = run_op(opdef, [env[i] for i in node.inputs], node.params, graph_seed, node.id, device)
        except Exception as exc:  # the user's error (bad params, data): name their op and line
            raise OpError(node, describe(exc, node)) from exc
        env[node.id] = value
        if check is not None:
            check(node, value)
        if last_use is not None:
            for i in node.inputs:
                if last_use.get(i) == index:
                    env.pop(i, None)  # pop: an op may read one value twice (x @ x)
    return env


def _node_of(op):
    """The `Node` the interpreter runs for a recorded `Op` (params not encoded: nothing goes on the wire)."""
    return Node(op.id, op.op, [i.id for i in op.inputs], op.params, b"", op.shape, op.dtype, op.source)


def evaluate(outputs, graph_seed=None, device="cpu"):
    """Compute recorded ops in this process (no Redis, no compiler) on `device`: a reference for tests.

    Returns one tensor per op in `outputs` (a single tensor if `outputs` is one Op)."""
    single = not isinstance(outputs, (list, tuple))
    outputs = [outputs] if single else list(outputs)
    values = _evaluate(outputs[0].graph, outputs, (), graph_seed, device)
    return values[0] if single else values


def evaluate_persisted(graph, names=None, graph_seed=None):
    """{name: tensor} of the values persisted in `graph` (all, or `names`), the values loop steps persist
    included: what a worker would store, computed in this process."""
    names = list(graph.persisted) + list(graph.step_outputs) if names is None else list(names)
    unknown = [n for n in names if n not in graph.persisted and n not in graph.step_outputs]
    if unknown:
        raise KeyError(f"not persisted in graph {graph.name!r}: {unknown}")
    ops = [graph.persisted[n] for n in names if n in graph.persisted]
    wanted = {n for n in names if n in graph.step_outputs}
    loops = [node_id for node_id, record in graph.loops.items()
             if any(n in wanted for per_template in record.names for per_output in per_template for n in per_output)]
    found = {}
    values = _evaluate(graph, ops, loops, graph_seed, step_values=found)
    result = dict(zip([n for n in names if n in graph.persisted], values))
    result.update((n, found[n]) for n in names if n in wanted)
    return result


def _evaluate(graph, outputs, loops, graph_seed, device="cpu", step_values=None):
    from .loop_run import LoopRun  # it runs steps with this module's op_seed
    seed = graph.seed if graph_seed is None else graph_seed
    roots = list(outputs) + [graph.nodes[i] for i in loops]
    needed, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if node.id not in needed:
            needed.add(node.id)
            stack.extend(node.inputs)
    inputs = registry.INPUTS
    env = {i: graph.constants[i].to(device) for i in needed if graph.nodes[i].op in inputs}
    rows = [_node_of(graph.nodes[i]) for i in sorted(needed) if graph.nodes[i].op not in inputs]
    last_use = {i: index for index, row in enumerate(rows) for i in row.inputs}  # free values as a worker does
    for o in roots:
        last_use.pop(o.id, None)
    start = 0
    with torch.no_grad():
        for index, row in enumerate(rows + [None]):
            if row is not None and row.op not in registry.LOOPS:
                continue
            run_nodes(rows[start:index], env, seed, device, _shifted(last_use, start))
            if row is None:
                break
            record = graph.loops[row.id]

            def keep(done, template, run, values, carried, record=record):
                if step_values is not None:
                    for names, value in zip(record.names[template], values):
                        step_values[names[run]] = value
            env[row.id] = tuple(LoopRun(record.message, [env[i] for i in row.inputs], seed, device).run(on_step=keep))
            start = index + 1
    return [env[o.id] for o in outputs]


def _shifted(last_use, start):
    return {i: index - start for i, index in last_use.items() if index >= start}
