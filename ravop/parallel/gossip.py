"""Gossip (dpwa's pair-wise averaging, made synchronous and seeded): after every step the replicas are paired at
random, from a generator seeded by the graph seed and the step, so the same graph and seed give the same pairs
and the same bits; each replica then moves towards its peer, `p <- p + a * (peer - p)`, with `a` from
`interpolation` as dpwa computes it:
- 'constant': `factor`;
- 'clock': peer_clock / (clock + peer_clock), the clocks being the samples each replica trained on (replicas step
  together here, so it is 0.5);
- 'loss': loss / (loss + peer_loss) of the two replicas' last batch losses: the worse replica moves further.
With `divergence_threshold` > 0 (dpwa's "diverge models when the loss reaches it"), a replica whose last loss is
below the threshold keeps its own parameters. With an odd number of replicas one sits each step out.

`resident` (None: the session picks at activation, resident where its live workers can hold every replica at
once; True; False): each replica is
one loop op for the whole fit whose state and shard stay where it runs, exchanging its model after every step
(ravop.parallel.resident_averaging); otherwise each step of each replica is a loop segment. Both give the same
bits."""
import numpy as np

from .replicas import Averaging, OnShards, check_replicas, check_resident
from .resident_averaging import ResidentGossip

INTERPOLATIONS = ("constant", "clock", "loss")


class Gossip(OnShards):
    def __init__(self, replicas, interpolation="constant", factor=0.5, divergence_threshold=0.0, resident=None):
        self.replicas, self.resident = check_replicas(replicas), check_resident(resident)
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, not {interpolation!r}")
        if not 0.0 <= float(factor) <= 1.0:
            raise ValueError(f"factor must be within [0, 1], not {factor!r}")
        if interpolation != "constant" and float(factor) != 0.5:
            raise ValueError(f"factor applies to interpolation='constant'; {interpolation!r} computes its own")
        if float(divergence_threshold) < 0:
            raise ValueError(f"divergence_threshold must be >= 0 (0: off), not {divergence_threshold!r}")
        self.interpolation, self.factor = interpolation, float(factor)
        self.divergence_threshold = float(divergence_threshold)

    @property
    def needs_loss(self):
        """Whether the exchange reads the replicas' last losses."""
        return self.interpolation == "loss" or self.divergence_threshold > 0

    def segments(self, n_steps, r):
        return [(first, 1) for first in range(n_steps)]

    def synchronizer(self, initial, layout, graph_seed):
        return _GossipSync(self, layout, graph_seed)

    def resident_templates(self, initial, layout, n_steps, graph_seed):
        return ResidentGossip(self, initial, layout, n_steps, graph_seed)

    def pairs(self, step, seed):
        """The (replica, peer) pairs after `step` steps: a permutation drawn from (seed, step), taken two by two."""
        order = np.random.default_rng([int(seed), int(step)]).permutation(self.replicas).tolist()
        return [(order[k], order[k + 1]) for k in range(0, self.replicas - 1, 2)]

    def exchange(self, states, losses, step, seed, shared):
        """Record the pair-wise interpolation after `step` steps of the values `shared` (a range: parameters and
        buffers; each replica keeps its optimizer state, as in dpwa) of each replica's state, replaced in
        `states[r]`; `losses[r]`: [replica r's last loss Op] when `needs_loss`."""
        at = slice(shared.start, shared.stop)
        for i, j in self.pairs(step, seed):
            old_i, old_j = states[i][at], states[j][at]
            states[i][at] = self.towards(old_i, old_j, losses[i], losses[j])
            states[j][at] = self.towards(old_j, old_i, losses[j], losses[i])

    def towards(self, own, peer, loss, peer_loss):
        if self.interpolation == "loss":
            a = loss[0] / (loss[0] + peer_loss[0])
        else:
            a = self.factor if self.interpolation == "constant" else 0.5
        if self.divergence_threshold > 0:
            a = loss[0].greater_equal(self.divergence_threshold).cast("float32") * a
        # integer buffers are counters (num_batches_tracked) that every replica advances alike
        return [p + (q - p) * a if p.dtype.is_floating_point else p for p, q in zip(own, peer)]

    def __repr__(self):
        return (f"Gossip(replicas={self.replicas}, interpolation={self.interpolation!r}, factor={self.factor}, "
                f"divergence_threshold={self.divergence_threshold}"
                + (f", resident={self.resident})" if self.resident is not None else ")"))


class _GossipSync(Averaging):
    """Gossip's exchanges for one fit; the model after it is the replicas' mean."""

    def __init__(self, gossip, layout, graph_seed):
        super().__init__(layout.model, layout)
        self.gossip, self.graph_seed = gossip, graph_seed

    def exchange(self, states, losses, step):
        self.gossip.exchange(states, losses, step, self.graph_seed, self.layout.model)
