"""DiLoCo (arXiv 2311.08105): replicas train on shards with their own inner optimizer and meet every
`inner_steps` steps, where an outer optimizer steps the global model with their averaged pseudo-gradient.

Replica r trains on shard r (as LocalSGD's shards) with its own copy of the model's optimizer, whose state
(moments, step count) stays with the replica across rounds. A round is `inner_steps` steps (the last one may
be shorter); after it:
- each replica's pseudo-gradient is `start - its parameters`, `start` being the parameters the round started
  from; with `compression` it is sent compressed with error feedback kept per replica (ravop.parallel.compression);
- their mean is the gradient of `torch.optim.SGD(lr=outer_lr, momentum=outer_momentum, nesterov=nesterov)` over
  the global model (momentum buffer as torch keeps it: the first step's is the gradient itself);
  with `compression` the outer step's change of the global parameters is sent back compressed the same way,
  with its own error feedback, and every replica and the global model apply what was received;
- buffers (BatchNorm statistics) become the replicas' mean;
- every replica starts the next round from the global model (parameters and buffers).
`update_frequency=k` (Ravnest's): an inner step is one optimizer update on the gradients of k batches summed, as
LocalSGD's; `inner_steps` counts such updates.

`outer_lr=1, outer_momentum=0` is LocalSGD's averaging (up to rounding). The model after fit (`save_model`,
`predict`) is the global model; its optimizer state is the replicas' mean.

`overlap=True` (Streaming DiLoCo's overlapped sync, one round of delay): round k+1 does not wait for round k's
outer step: it starts from the global model as it was before that step (so rounds 0 and 1 both start from the
initial model, round k >= 1 from the global model after k - 1 outer steps), while outer step k runs beside it
and lands when round k+1 ends. Pseudo-gradients are taken against each round's own start, and applied to the
latest global model: outer step k maps the global model after k steps to the one after k + 1 with round k's
pseudo-gradient. The model after fit has every round's outer step applied (the last one is not overlapped).
In the graph, round k+1's segments do not read outer step k, so workers run them at the same time.

`overlap_start='local'` (with overlap; Streaming DiLoCo keeps each worker's local progress where this restarts
from a stale model): at sync k each replica restarts from that same global model minus its own round-k
pseudo-gradient (as received, i.e. after compression: its parameters give or take the compression's error,
moved by the outer steps it has not seen), and takes its next pseudo-gradient against that start. The stale
start made replicas learn again what round k taught, so the outer step counted it twice: the paper's outer lr 0.7
/ Nesterov 0.9 diverged, and the settings that trained stayed 2-3 points under one worker in the WAN lab's task;
the local start trains with the paper's settings to one worker's accuracy there (docs/reports/wan_lab.md).

`resident` (None: the session picks at activation, resident where its live workers can hold every replica at
once; True; False): each replica is
one loop op for the whole fit whose state stays where it runs, and only (compressed) pseudo-gradients and
updates cross the store (ravop.parallel.resident); otherwise each round of each replica is a loop segment whose
carried values go through the store. Both give the same bits, with or without `overlap`.

`round=R.parallel.Shares(1, 1, 0.5, 0.25)` (ravop.parallel.rounds): providers of unequal speeds. A round is a
budget of samples split among the replicas in proportion to their shares: the replica of the largest share runs
`inner_steps` per round, the others fewer, each on a shard in proportion (the same rounds in every shard), and
the pseudo-gradients, buffers and the optimizer state after fit are averaged weighted by the samples each replica
trained on (hivemind's target batch). The schedule is fixed when the fit is recorded: the same bits on any
workers, resident or not. Equal shares are the default's bits (plain means).

`close_after=S` (seconds; resident replicas only; Decoupled DiLoCo's islands): replica 0 waits at most S seconds at
a sync for the others' pseudo-gradients; the round closes with the replicas present, their weights renormalised
over them (ravop/parallel/resident.py). A late replica's round is dropped (it restarts from the new global model);
which replicas a round went without is recorded in the store, so a replay of replica 0 makes the same choice.
Rounds that went without no one give the bits of the same fit without `close_after`; one that went without a
replica gives bits that depend on the machines' timing. Replica 0 itself is never skipped: the others wait for it.
"""
from typing import Any, List, Tuple

from ..record.forms import RESIDENT
from .compression import check_compression, send
from .resident import ResidentDiLoCo
from .replicas import OnShards, check_replicas, check_resident, check_update_frequency, every, weighted_mean
from .rounds import check_round, shard_rows

OVERLAP_STARTS = ("global", "local")   # where a replica restarts with overlap: the stale global model, or plus
#                                        its own last pseudo-gradient's progress


class DiLoCo(OnShards):
    def __init__(self, replicas, inner_steps, outer_lr=0.7, outer_momentum=0.9, nesterov=True, compression=None,
                 overlap=False, update_frequency=1, resident=None, overlap_start="global",
                 round=None, close_after=None):
        self.replicas = check_replicas(replicas)
        self.update_frequency = check_update_frequency(update_frequency)
        if type(inner_steps) is not int or inner_steps < 1:
            raise ValueError(f"inner_steps must be a positive int (steps between outer steps), not {inner_steps!r}")
        if isinstance(outer_lr, bool) or not isinstance(outer_lr, (int, float)) or outer_lr <= 0:
            raise ValueError(f"outer_lr must be a number > 0, not {outer_lr!r}")
        if isinstance(outer_momentum, bool) or not isinstance(outer_momentum, (int, float)) or \
                not 0 <= outer_momentum < 1:
            raise ValueError(f"outer_momentum must be within [0, 1), not {outer_momentum!r}")
        if not isinstance(nesterov, bool) or not isinstance(overlap, bool):
            raise TypeError(f"nesterov and overlap take True or False, not {nesterov!r} and {overlap!r}")
        if nesterov and outer_momentum == 0:
            raise ValueError("nesterov=True needs outer_momentum > 0 (as torch.optim.SGD): give nesterov=False")
        self.inner_steps, self.outer_lr, self.outer_momentum = inner_steps, float(outer_lr), float(outer_momentum)
        self.nesterov, self.compression, self.overlap = nesterov, check_compression(compression), overlap
        if overlap_start not in OVERLAP_STARTS:
            raise ValueError(f"overlap_start is one of {', '.join(map(repr, OVERLAP_STARTS))}, not {overlap_start!r}")
        if overlap_start != "global" and not overlap:
            raise ValueError(f"overlap_start={overlap_start!r} needs overlap=True")
        self.overlap_start = overlap_start
        self.resident = check_resident(resident)
        self.round = check_round(round, self.replicas)
        self.steps = self.round.steps(inner_steps) if self.round else [inner_steps] * self.replicas
        # the replicas' weights in a mean: the share of a round's samples each trained on (None: equal, `average`)
        self.weights = None if len(set(self.steps)) == 1 else [s / sum(self.steps) for s in self.steps]
        if close_after is not None and (isinstance(close_after, bool) or not isinstance(close_after, (int, float))
                                        or not close_after > 0):
            raise ValueError(f"close_after must be None or seconds > 0 (the longest wait at a sync for a late "
                             f"replica), not {close_after!r}")
        if close_after is not None and self.resident is False:
            raise ValueError("close_after needs resident replicas (a round's segments wait for each other): "
                             "leave resident=False out")
        self.close_after = None if close_after is None else float(close_after)

    def resident_forms(self) -> List[str]:
        """close_after needs resident replicas (segments wait for each other at every round): with it, resident=None
        records the resident form only (a replica waiting for a late one is handed back to take turns where the
        live workers cannot hold them all: worker/loops/hand_back.py)."""
        return [RESIDENT] if self.close_after is not None else super().resident_forms()

    def shard_rows(self, n_rows: int, rows_per_step: int) -> List[int]:
        if len(set(self.steps)) == 1:
            return super().shard_rows(n_rows, rows_per_step)
        return shard_rows(self.steps, n_rows, rows_per_step)

    def segments(self, n_steps: int, r: int) -> List[Tuple[int, int]]:
        """(first step, steps) of each of replica r's rounds."""
        return every(n_steps, self.steps[r])

    def mean(self, values: List[Any]) -> Any:
        """The replicas' mean of `values` (one per replica), weighted by their samples per round."""
        return weighted_mean(values, self.weights)

    def synchronizer(self, initial, layout, graph_seed):
        return _OuterSteps(self, initial, layout)

    def resident_templates(self, initial, layout, n_steps, graph_seed):
        return ResidentDiLoCo(self, initial, layout)

    def __repr__(self):
        return (f"DiLoCo(replicas={self.replicas}, inner_steps={self.inner_steps}, outer_lr={self.outer_lr}, "
                f"outer_momentum={self.outer_momentum}, nesterov={self.nesterov}, compression={self.compression!r}, "
                f"overlap={self.overlap}"
                + (f", overlap_start={self.overlap_start!r}" if self.overlap_start != "global" else "")
                + (f", update_frequency={self.update_frequency}" if self.update_frequency > 1 else "")
                + (f", round={self.round!r}" if self.round else "")
                + (f", close_after={self.close_after:g}" if self.close_after is not None else "")
                + (f", resident={self.resident})" if self.resident is not None else ")"))


class _OuterSteps:
    """One fit's outer optimizer: the global model, the rounds' start, the momentum buffers and the error
    feedback residuals, all graph values (Ops) carried from round to round."""

    def __init__(self, diloco, initial, layout):
        self.diloco, self.layout = diloco, layout
        self.global_ = list(initial[layout.params.start:layout.buffers.stop])   # parameters, then buffers
        self.start = list(self.global_)       # what the current round started from
        self.local = diloco.overlap_start == "local"
        self.starts = [self.start] * diloco.replicas   # ... per replica (overlap_start='local')
        self.momentum = [None] * len(layout.params)
        self.up = [[None] * len(layout.params) for _ in range(diloco.replicas)]   # per replica residuals
        self.down = [None] * len(layout.params)                                    # the update's residuals

    def exchange(self, states, losses, step):
        d = self.diloco
        new_global, own = [], [[] for _ in states]
        for k in self.layout.params:
            pseudo = [start[k] - state[k] for start, state in zip(self.starts, states)]
            if d.compression:
                sent = [send(g, self.up[r][k], d.compression) for r, g in enumerate(pseudo)]
                pseudo = [received for received, _ in sent]
                for r, (_, residual) in enumerate(sent):
                    self.up[r][k] = residual
            for r, g in enumerate(pseudo):
                own[r].append(g)
            new_global.append(self.global_[k] + self._update(k, d.mean(pseudo)))
        for k in self.layout.buffers:
            new_global.append(d.mean([state[k] for state in states]))
        self.start = self.global_ if d.overlap else new_global
        self.starts = [self.start] * d.replicas
        if self.local:   # the stale global model minus the replica's own pseudo-gradient (parameters only)
            self.starts = [[self.start[k] - own[r][k] for k in self.layout.params] + self.start[len(own[r]):]
                           for r in range(d.replicas)]
        self.global_ = new_global
        for start, state in zip(self.starts, states):   # integer buffers are counters each replica advances
            for k in self.layout.model:                 # (num_batches_tracked): its own
                if start[k].dtype.is_floating_point:
                    state[k] = start[k]

    def _update(self, k, grad):
        """The change torch.optim.SGD makes to parameter k with `grad`, as it is received."""
        d = self.diloco
        if d.outer_momentum:
            buf = grad if self.momentum[k] is None else self.momentum[k] * d.outer_momentum + grad
            self.momentum[k] = buf
            grad = grad + buf * d.outer_momentum if d.nesterov else buf
        update = grad * -d.outer_lr
        if d.compression:
            update, self.down[k] = send(update, self.down[k], d.compression)
        return update

    def finish(self, states):
        """The global model, with the replicas' mean optimizer state."""
        final = list(self.global_)
        for k in self.layout.optimizer:
            final.append(self.diloco.mean([state[k] for state in states]))
        return final
