"""DiLoCo's rounds as resident replicas: one loop op per replica for the whole fit, whose parameters, optimizer
state, error-feedback residuals and data shard stay in the memory of the worker that runs it (and in its loop
checkpoint), so that only what the algorithm exchanges crosses the store each round.

Replica r's loop carries its train state, the global model it knows (parameters, then buffers) and, with
compression, its residual per parameter; replica 0 also carries the outer optimizer (momentum buffers, the
update's residuals) and, with `overlap`, the round's start and the update it has not sent yet. After every
`inner_steps` training steps and after the last one, its sync templates run:
- replica r > 0: `up` sends its pseudo-gradient `global - parameters` (compressed with error feedback when
  `compression` is set) and its float buffers; `down` receives the outer step's update (compressed) and the
  mean buffers, adds the update to its global model and restarts from it;
- replica 0: `outer` receives the others' pseudo-gradients and buffers, takes its own, steps the outer
  optimizer as `DiLoCo`'s in-graph synchronizer does (the same ops in the same order: the same bits), sends the
  update and the mean buffers, and restarts from the new global model.
With `overlap` (Streaming DiLoCo, DiLoCo's docstring) replica 0 sends outer step k's update right after it, as
run k + 1 of a `send` template that also runs once before the first step (its run 0: a zero update and the
initial buffers): so at sync k a replica r > 0 receives update k - 1, sent when outer step k - 1 was done, and
restarts from the global model before outer step k, without waiting for the others' pseudo-gradients, the outer
step, nor replica 0's arrival at sync k (only for the slowest replica's arrival at sync k - 1); replica 0 keeps
the latest global model (every outer step applied: the model after fit) and the round's start apart. The update
sent after the last outer step is read by no one (it stays in the store until the graph is flushed).
With `overlap_start='local'` a replica restarts from that model minus its own pseudo-gradient as received:
replica r > 0 carries its round's start apart from its global model (between `up` and `down` the slot holds the
pseudo-gradient `up` sent, which `down` subtracts); replica 0 restarts so from the model before its outer step.
So per round a replica r > 0 sends one (compressed) pseudo-gradient and receives one (compressed) update; the
channels are named `{kind}.{replica}.{k}` per value k (worker/loops/exchange.py stores them).
With `close_after` (DiLoCo's docstring) a replica r > 0 also sends `present.{r}` (1.0) and replica 0 receives all
of a replica's values as optional: those of a replica not there within `close_after` s are zeros, its `present` 0,
and the means are renormalised over the replicas present; when every replica is present the mean is the plain
one, bit for bit (`static * 1 + renormalised * 0`)."""
from typing import Any, Callable, List

import torch

import ravop as R

from .compression import compress, decompress


def _zeros_like(op, dtype=None):
    return R.zeros(shape=tuple(op.shape), dtype=str(dtype or op.dtype).replace("torch.", ""))


class ResidentDiLoCo:
    """The extra carried values and the sync templates of one fit's replicas (see the module docstring)."""

    def __init__(self, diloco, initial, layout):
        self.diloco, self.layout = diloco, layout
        self.close_after_s = diloco.close_after or 0.0   # the longest wait at a sync for an optional value
        self.model = list(initial[layout.model.start:layout.model.stop])   # global parameters, then buffers
        params = self.model[:len(layout.params)]
        self.floats = [k for k in layout.buffers if initial[k].dtype.is_floating_point]
        self.residuals = [_zeros_like(p) for p in params] if diloco.compression else []
        momentum = [_zeros_like(p) for p in params] if diloco.outer_momentum else []
        down = [_zeros_like(p) for p in params] if diloco.compression else []
        start, pending = [], []
        if diloco.overlap:   # the round's start, and what `send` sends next: a zero update, the initial buffers
            start = list(self.model)
            narrow = {"fp16": torch.float16, "int8": torch.int8}.get(diloco.compression)
            pending = [_zeros_like(p, narrow) for p in params] + \
                ([R.zeros(shape=(), dtype="float32") for _ in params] if diloco.compression == "int8" else []) + \
                [initial[k] for k in self.floats]
        self.outer = {"momentum": momentum, "down": down, "start": start, "pending": pending}
        self.local = diloco.overlap_start == "local"
        self.own_start = list(params) if self.local else []   # replicas r > 0: the round's start (see above)
        self.n_state = None

    def interval(self, r: int) -> int:
        """Replica r's training steps between two syncs (its steps per round)."""
        return self.diloco.steps[r]

    def extra(self, r):
        """The values replica r's loop carries besides its train state, initially."""
        return self.model + self.residuals + \
            ([v for group in self.outer.values() for v in group] if r == 0 else self.own_start)

    def sync_steps(self, loop, r, n_state):
        """Record replica r's sync templates on `loop` (whose carried values are its train state of `n_state`
        values, then `extra(r)`); returns their template indices."""
        self.n_state = n_state
        first = len(loop.templates)
        if r == 0:
            with loop.step(counts=False) as step:
                step.carry(self._outer(step, n_state))
            if self.diloco.overlap:   # right after the outer step, and once before the first step (its run 0)
                with loop.step(counts=False, before_first=True) as step:
                    self._send_pending(step, n_state)
                    step.carry(step.carried)
            return list(range(first, len(loop.templates)))
        with loop.step(counts=False) as step:
            step.carry(self._up(step, r, n_state))
        with loop.step(counts=False) as step:
            step.carry(self._down(step, n_state))
        return [first, first + 1]

    def _split(self, step, n_state):
        """(train state, global model, residuals, replica 0's outer values by group, or a replica r > 0's
        start as {"start": values}) of the carried values."""
        carried = list(step.carried)
        n_model, n_res = len(self.model), len(self.residuals)
        state, rest = carried[:n_state], carried[n_state:]
        at = n_model + n_res
        if self.own_start and len(rest) == at + len(self.own_start):   # a replica r > 0's (replica 0 carries more)
            return state, rest[:n_model], rest[n_model:at], {"start": rest[at:]}
        outer = {}
        for name, group in self.outer.items():
            outer[name], at = rest[at:at + len(group)], at + len(group)
        return state, rest[:n_model], rest[n_model:n_model + n_res], outer

    def _pseudo(self, state, start, residuals, k):
        """(what is sent of parameter k's pseudo-gradient against the round's `start`: the values and the int8
        scale or None, what the receiver reads, the residual kept)."""
        pseudo = start[k] - state[k]
        kind = self.diloco.compression
        if not kind:
            return (pseudo, None), pseudo, None
        true = pseudo + residuals[k]
        sent = compress(true, kind)
        received = decompress(*sent)
        return sent, received, true - received

    def _up(self, step, r, n_state):
        state, model, residuals, own = self._split(step, n_state)
        residuals, start = list(residuals), list(own.get("start", ()))
        for k in self.layout.params:
            (values, scale), received, residual = self._pseudo(state, start or model, residuals, k)
            if start:
                start[k] = received   # for `down`: the replica restarts from the new model minus it
            step.send(values, f"up.{r}.{k}")
            if scale is not None:
                step.send(scale, f"upscale.{r}.{k}")
            if residual is not None:
                residuals[k] = residual
        for k in self.floats:
            step.send(state[k], f"buffer.{r}.{k}")
        if self.close_after_s:
            step.send(R.zeros(shape=(), dtype="float32") + 1.0, f"present.{r}")
        return state + model + residuals + start

    def _received_update(self, step, k, like):
        values = step.receive(f"down.{k}", like if not self.diloco.compression else _narrow(like, self.diloco))
        scale = step.receive(f"downscale.{k}", _scalar(like)) if self.diloco.compression == "int8" else None
        return decompress(values, scale) if self.diloco.compression else values

    def _down(self, step, n_state):
        state, model, residuals, own = self._split(step, n_state)
        new_model = [model[k] + self._received_update(step, k, model[k]) for k in self.layout.params]
        for k in self.layout.buffers:
            new_model.append(step.receive(f"buffermean.{k}", state[k]) if k in self.floats else state[k])
        if not self.local:
            return self._restart(state, new_model) + new_model + residuals
        start = self._local_start(new_model, own["start"])
        return self._restart(state, start) + new_model + residuals + start[:len(self.own_start)]

    def _local_start(self, model, pseudo):
        """overlap_start='local': `model` (parameters, then buffers) minus the replica's own pseudo-gradient."""
        n = len(pseudo)
        return [model[k] - pseudo[k] for k in range(n)] + list(model[n:])

    def _restart(self, state, new_model):
        """`state` restarted from `new_model`, but for integer buffers: counters each replica advances
        (num_batches_tracked), which stay its own."""
        state = list(state)
        for k, value in zip(self.layout.model, new_model):
            if value.dtype.is_floating_point:
                state[k] = value
        return state

    def _send_pending(self, step, n_state):
        """Replica 0 with overlap: send the last outer step's update and mean buffers (`pending`)."""
        pending = self._split(step, n_state)[3]["pending"]
        n = len(self.layout.params)
        int8 = self.diloco.compression == "int8"
        for k in self.layout.params:
            step.send(pending[k], f"down.{k}")
            if int8:
                step.send(pending[n + k], f"downscale.{k}")
        for k, mean in zip(self.floats, pending[n * (1 + int8):]):
            step.send(mean, f"buffermean.{k}")

    def _outer(self, step, n_state):
        d = self.diloco
        state, model, residuals, outer = self._split(step, n_state)
        residuals, momentum, down = list(residuals), list(outer["momentum"]), list(outer["down"])
        start = outer["start"] or model   # without overlap a round starts from the latest global model
        new_model, sent, scales, means = [], [], [], []
        owns = []
        islands = bool(self.close_after_s)
        mean = self._islands_mean(step) if islands else d.mean
        for k in self.layout.params:
            _, own, residual = self._pseudo(state, start, residuals, k)
            if residual is not None:
                residuals[k] = residual
            owns.append(own)
            pseudo = [own]
            for r in range(1, d.replicas):
                like = state[k] if not d.compression else _narrow(state[k], d)
                values = step.receive(f"up.{r}.{k}", like, optional=islands)
                scale = step.receive(f"upscale.{r}.{k}", _scalar(state[k]), optional=islands) \
                    if d.compression == "int8" else None
                pseudo.append(decompress(values, scale) if d.compression else values)
            grad = mean(pseudo)
            if d.outer_momentum:   # torch.optim.SGD's buffer; the first round's is 0 * momentum + grad = grad
                momentum[k] = momentum[k] * d.outer_momentum + grad
                grad = grad + momentum[k] * d.outer_momentum if d.nesterov else momentum[k]
            update = grad * -d.outer_lr
            values, scale = update, None
            if d.compression:
                true = update + down[k]
                values, scale = compress(true, d.compression)
                update = decompress(values, scale)
                down[k] = true - update
            sent.append(values)
            scales += [scale] if scale is not None else []
            new_model.append(model[k] + update)
        for k in self.layout.buffers:
            if k in self.floats:
                buffers = [step.receive(f"buffer.{r}.{k}", state[k], optional=islands) for r in range(1, d.replicas)]
                means.append(mean([state[k]] + buffers))
                new_model.append(means[-1])
            else:
                new_model.append(state[k])
        if d.overlap:   # sent at the next sync; the replicas restart from the model before this outer step
            restart = self._local_start(model, owns) if self.local else model
            return self._restart(state, restart) + new_model + residuals + momentum + down + restart + \
                sent + scales + means
        for k, values in zip(self.layout.params, sent):
            step.send(values, f"down.{k}")
        for k, scale in zip(self.layout.params, scales):
            step.send(scale, f"downscale.{k}")
        for k, mean in zip(self.floats, means):
            step.send(mean, f"buffermean.{k}")
        return self._restart(state, new_model) + new_model + residuals + momentum + down

    def _islands_mean(self, step: Any) -> Callable[[List[Any]], Any]:
        """The replicas' mean at a sync that may close without some (`close_after`): each replica's `present`
        (0 for one the round went without) weighs it, renormalised over those present; when all are present,
        exactly the plain mean (DiLoCo's `mean`)."""
        d = self.diloco
        present = [None] + [step.receive(f"present.{r}", _scalar(None), optional=True) for r in range(1, d.replicas)]
        weights = d.weights or [1.0 / d.replicas] * d.replicas
        kept = [present[r] * weights[r] for r in range(1, d.replicas)]
        total = kept[0] + weights[0]
        for w in kept[1:]:
            total = total + w
        everyone = present[1]
        for p in present[2:]:
            everyone = everyone * p
        shares = [weights[0] / total] + [w / total for w in kept]

        def mean(values: List[Any]) -> Any:
            if not values[0].dtype.is_floating_point:
                return values[0]
            renormalised = values[0] * shares[0]
            for value, share in zip(values[1:], shares[1:]):
                renormalised = renormalised + value * share
            return d.mean(values) * everyone + renormalised * (1.0 - everyone)
        return mean

    def finish(self, finals):
        """The model after fit from the replicas' carried values after their loops: the global model (replica
        0's, every outer step applied) and the replicas' mean optimizer state."""
        at = self.n_state
        final = list(finals[0][at:at + len(self.model)])
        for k in self.layout.optimizer:
            final.append(self.diloco.mean([carried[k] for carried in finals]))
        return final


class _Like:
    """A shape and dtype for `Step.receive`."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def _narrow(like, diloco):
    return _Like(tuple(like.shape), torch.float16 if diloco.compression == "fp16" else torch.int8)


def _scalar(like):
    return _Like((), torch.float32)
