"""Resident pipeline stages (Pipeline(..., resident=...), docs/users/strategies.md): one loop op per stage for the whole
fit, so a stage's parameters, optimizer state and buffers stay in the memory of the worker that runs it (and in
its loop checkpoint); only activations and their gradients cross the store, and the plan does not grow with the
steps.

Stage s's loop carries its parameters, buffers, optimizer state and, per micro-batch m, the stage's input and the
parameters' gradients (the last stage: the target and the loss instead of the input). Its training step only
reads the batch (stage 0: X's rows, the last stage: y's, cut into micro-batches as `Pipeline.micro_slices`); after
every training step its sync templates run in turn:
- `forward m`: receive micro-batch m's activation on `{fit}.act.{s-1}.{m}` (stage 0: its carried rows), run the
  stage's forward (BatchNorm's running statistics move here, once per micro-batch in order) and send the output on
  `{fit}.act.{s}.{m}`; the last stage takes the loss and the gradients at once and sends its input's gradient;
- `backward m`: receive `{fit}.grad.{s}.{m}`, recompute the forward (its statistics dropped) and take the
  gradients, sending the input's gradient on `{fit}.grad.{s-1}.{m}`;
- `update`: one optimizer step on the micro-batches' gradients weighted by their sizes (the last stage persists
  the batch's loss).
These are the segment recording's ops, in its order per stage, so both give the same mathematics; dropout in
`forward m` and in `backward m`'s recompute draws from the stream `stage_stream(graph seed, m, s, k)` names, shared
by the two templates (`Step.seed_by_step`), which gives the segments' `stage_seed` at every step; the optimizer
step of `update` is recorded one count lower, as a sync template counts the training step it follows
(`Step.counted_params`). Carried values keep one shape, so every batch must be full (`batch_size` divides the
rows)."""
from typing import Any, Optional, Sequence

import ravop as R
from ravop.parallel.pipeline import stage_stream
from ravop.parallel.replicas import weighted_sum
from ravop.record.graph import current_graph
from ravop.record.loop import Batches, Loop

from .layers.base import as_input
from .optimizers import Optimizer


def resident_reason(strategy: Any, n_rows: int, batch_size: int) -> Optional[str]:
    """Why `strategy`'s stages cannot be resident in this fit (None: they can). Whether the live workers can hold
    every stage at once is the session's to say, at activation (ravop/record/forms.py)."""
    if strategy.replicas > 1:
        return "replicas > 1 (its copies of a stage would exchange gradients every step)"
    if n_rows % batch_size:
        return (f"a batch_size of {batch_size} leaves a short last batch of {n_rows % batch_size} of the {n_rows} "
                "rows, and a loop's carried micro-batches keep one shape: give a batch_size that divides the rows")
    return None


def _zeros(shape: Sequence[int], dtype: Any) -> Any:
    return R.zeros(shape=tuple(shape), dtype=str(dtype).replace("torch.", ""))


def _zeros_like(op: Any) -> Any:
    return _zeros(op.shape, op.dtype)


class _StageState:
    """A stage's model values as Slots of its stage object and the model's optimizer: bound to a template's holes
    while it is recorded, to the loop's results after it."""

    def __init__(self, stage: Any, optimizer: Optimizer) -> None:
        self.stage, self.optimizer = stage, optimizer
        self.opt_keys = stage.optimizer_slots()
        params = stage.params()
        self.states = [optimizer.state_of(key, param) for key, param in zip(self.opt_keys, params)]
        self.used = list(optimizer.used_state())
        self.counts = [state["step"] for state in self.states]
        self.n_params, self.n_buffers = len(params), len(stage.buffers())

    def values(self) -> list[Any]:
        return [*self.stage.params(), *self.stage.buffers(),
                *[state[name] for state in self.states for name in self.used]]

    def bind(self, values: Sequence[Any]) -> list[Any]:
        """Set the stage's values from `values` (in `values()` order); returns the rest."""
        values = list(values)
        for k in range(self.n_params):
            self.stage.set_param(k, values[k])
        self.stage.set_buffers(values[self.n_params:self.n_params + self.n_buffers])
        rest = values[self.n_params + self.n_buffers:]
        for state in self.states:
            for name in self.used:
                state[name], rest = rest[0], rest[1:]
        return rest

    def size(self) -> int:
        return self.n_params + self.n_buffers + self.n_params * len(self.used)


def record_resident_pipeline(model: Any, X: Any, y: Any, stages: Sequence[Any], strategy: Any, n_epochs: int,
                             batch_size: int, shuffle: bool, seed: int, names: list[str],
                             loops: dict[str, list[int]]) -> None:
    """Record one loop per stage (module docstring) over `n_epochs` of (X, y), arrays, in full batches; `names`:
    the training loss names of the steps, in order; `loops`: role -> loop op ids (the placement)."""
    graph = current_graph()
    fit = f"pipe{len(graph.loops)}"   # channels of this fit: a graph may hold several
    n_rows = len(X)
    bounds = strategy.micro_slices(batch_size)
    weights = [(stop - start) / batch_size for start, stop in bounds]
    n_steps = n_epochs * (n_rows // batch_size)
    # Any: a loop step's rows and carried values are ravop.record.graph's Ops, which R's stub types apart
    X_op: Any = as_input(X)
    y_op: Any = as_input(y)
    last = len(stages) - 1
    in_shapes = [(stop - start,) + tuple(X_op.shape[1:]) for start, stop in bounds]
    for s, stage in enumerate(stages):
        state = _StageState(stage, model.optimizer)
        counters = stage.counters()
        wrt_input = s > 0
        has_grads = bool(state.n_params)
        backward = s < last and (has_grads or wrt_input)
        like_in: list[Any] = [_zeros(shape, X_op.dtype) for shape in in_shapes] if s == 0 else \
            [R.zeros(shape=(stop - start,) + tuple(stages[s - 1].out_shape), dtype="float32")
             for start, stop in bounds]
        like_out: list[Any] = [R.zeros(shape=(stop - start,) + tuple(stage.out_shape), dtype="float32")
                               for start, stop in bounds]
        params = stage.params()
        grads0 = [[_zeros_like(p) for p in params] for _ in bounds] if has_grads else [[] for _ in bounds]
        inputs0 = list(like_in) if (s == 0 or backward) else []
        targets0 = [_zeros((stop - start,) + tuple(y_op.shape[1:]), y_op.dtype) for start, stop in bounds] \
            if s == last else []
        losses0: list[Any] = [R.zeros(shape=(), dtype="float32") for _ in bounds] if s == last else []
        model_values = state.values()
        layout = _Layout(state.size(), len(inputs0), [len(g) for g in grads0], len(targets0), len(losses0))
        reads_rows = s == 0 or s == last
        loop = Loop([*model_values, *inputs0, *[g for gs in grads0 for g in gs], *targets0, *losses0],
                    Batches(n_rows, batch_size, shuffle, seed) if reads_rows else None)

        with loop.step() as step:   # the training step: the batch's rows, cut into micro-batches
            parts = layout.split(step.carried)
            rows: Any   # a graph Op: R's stub types its slicing
            if s == 0:
                rows = step.rows(X_op, batch_size)
                parts["inputs"] = [rows[start:stop] for start, stop in bounds]
            if s == last:
                rows = step.rows(y_op, batch_size)
                parts["targets"] = [rows[start:stop] for start, stop in bounds]
            step.carry(layout.join(parts))

        sync: list[int] = []
        for m, (start, stop) in enumerate(bounds):
            with loop.step(counts=False) as step:   # forward m
                parts = layout.split(step.carried)
                state.bind(parts["model"])
                a = parts["inputs"][m] if s == 0 else step.receive(f"{fit}.act.{s - 1}.{m}", like_in[m])
                seeds = _Seeds(graph.seed, m, s)
                out, after = stage.forward(a, stage.buffers(), seeds, counts=True)
                stage.set_buffers(after)
                if s == last:
                    loss = model.loss_function(parts["targets"][m], out)
                    grads = R.grad(loss, stage.params() + [a] * wrt_input)
                    if wrt_input:
                        step.send(grads.pop(), f"{fit}.grad.{s - 1}.{m}")
                    parts["grads"][m], parts["losses"][m] = grads, loss
                else:
                    step.send(out, f"{fit}.act.{s}.{m}")
                    if wrt_input and backward:
                        parts["inputs"][m] = a
                parts["model"] = state.values()
                step.seed_by_step(seeds.given)
                step.carry(layout.join(parts))
            sync.append(len(loop.templates) - 1)
        for m, (start, stop) in enumerate(bounds if backward else []):
            with loop.step(counts=False) as step:   # backward m: the recompute, its statistics dropped
                parts = layout.split(step.carried)
                state.bind(parts["model"])
                g_out = step.receive(f"{fit}.grad.{s}.{m}", like_out[m])
                a = parts["inputs"][m]
                seeds = _Seeds(graph.seed, m, s)
                out, _ = stage.forward(a, stage.buffers(), seeds, counts=False)
                grads = R.grad(out, stage.params() + [a] * wrt_input, grad_output=g_out)
                if wrt_input:
                    step.send(grads.pop(), f"{fit}.grad.{s - 1}.{m}")
                parts["grads"][m] = grads
                step.seed_by_step(seeds.given)
                step.carry(layout.join(parts))
            sync.append(len(loop.templates) - 1)
        with loop.step(counts=False) as step:   # update: one optimizer step, counted as the training step's
            parts = layout.split(step.carried)
            state.bind(parts["model"])
            if s == last:
                step.persist(weighted_sum(parts["losses"], weights), names)
            for st, count in zip(state.states, state.counts):
                st["step"] = count - 1   # Optimizer.update records count: one lower in a sync template
            for k in range(state.n_params):
                stage.apply(k, weighted_sum([per_micro[k] for per_micro in parts["grads"]], weights))
            parts["model"] = state.values()
            step.carry(layout.join(parts))
        sync.append(len(loop.templates) - 1)

        finals = loop.run([(0, n_rows // batch_size)], rounds=n_epochs, sync=sync, sync_every=1)
        loops.setdefault(f"stage {s}", []).append(list(graph.loops)[-1])
        state.bind(layout.split(finals)["model"])
        for st, count in zip(state.states, state.counts):
            st["step"] = count + n_steps
        for (leaf, before), (_, recorded) in zip(counters, stage.counters()):
            leaf.batches_tracked = before + (recorded - before) * n_steps


class _Seeds:
    """`seed_of(k)` of a stage's forward in a loop: the stream's seed, noted for `Step.seed_by_step`."""

    def __init__(self, graph_seed: int, m: int, s: int) -> None:
        self.graph_seed, self.m, self.s = graph_seed, m, s
        self.given: set[int] = set()

    def __call__(self, k: int) -> int:
        seed = stage_stream(self.graph_seed, self.m, self.s, k)
        self.given.add(seed)
        return seed


class _Layout:
    """Where a stage loop's carried values sit: the model values, then per micro-batch the inputs, the gradients,
    the targets and the losses."""

    def __init__(self, n_model: int, n_inputs: int, n_grads: list[int], n_targets: int, n_losses: int) -> None:
        self.n_model, self.n_inputs, self.n_grads = n_model, n_inputs, n_grads
        self.n_targets, self.n_losses = n_targets, n_losses

    def split(self, values: Sequence[Any]) -> dict[str, Any]:
        values = list(values)
        model, values = values[:self.n_model], values[self.n_model:]
        inputs, values = values[:self.n_inputs], values[self.n_inputs:]
        grads: list[list[Any]] = []
        for n in self.n_grads:
            grads.append(values[:n])
            values = values[n:]
        targets, values = values[:self.n_targets], values[self.n_targets:]
        return {"model": model, "inputs": inputs, "grads": grads, "targets": targets, "losses": values}

    def join(self, parts: dict[str, Any]) -> list[Any]:
        return [*parts["model"], *parts["inputs"], *[g for gs in parts["grads"] for g in gs], *parts["targets"],
                *parts["losses"]]
