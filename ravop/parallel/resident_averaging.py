"""LocalSGD's and Gossip's rounds as resident replicas (as DiLoCo's, ravop.parallel.resident): one loop op per
replica for the whole fit, whose train state and data shard stay in the memory of the worker that runs it, and
sync templates that exchange only what the algorithm averages. Each computes what the segment recording's
synchronizer computes, with the same ops in the same order, so both give the same bits.

- LocalSGD (`ResidentAveraging`), a star through replica 0: after every `sync_every` steps and the last one,
  replica r > 0 sends its averaged values (parameters and float buffers; with `average_optim` the optimizer's
  state too) on `avg.{r}.{k}` and receives their mean on `mean.{k}`; replica 0 receives the others', takes the
  mean with its own and sends it. Per round a replica r > 0 moves one model up and one down.
- Gossip (`ResidentGossip`), all to all: after every step each replica sends its parameters and float buffers
  (and its last loss, when the interpolation reads it) on `gossip.{r}.{k}`, receives every other replica's, and
  picks its peer's with the pairing after that step, read from a table of peers per step (`step_row`, indexed by
  the loop's step counter: the table is uploaded once, the plan does not grow). Per step a replica moves one
  model up and `replicas - 1` down (one for two replicas): a replica's template cannot name its peer's channel,
  which changes every step.
Integer buffers (BatchNorm's num_batches_tracked) advance alike in every replica and stay where they are."""
import numpy as np

import ravop as R

from .replicas import average


class _Resident:
    """What resident LocalSGD and Gossip share: no extra carried values, and the model after fit."""
    close_after_s = 0.0   # every sync waits for every replica

    def __init__(self, layout, initial, kept):
        """`kept`: the indices every replica holds the same bits of after the last synchronisation."""
        self.layout, self.kept = layout, kept
        self.floats = [k for k in kept if initial[k].dtype.is_floating_point]

    def extra(self, r):
        return []

    def finish(self, finals):
        """The model after fit: what the replicas share after the last synchronisation (replica 0's), the
        replicas' mean of the rest, as the segment recording's `Averaging.finish`."""
        return [finals[0][k] if k in self.kept else average([carried[k] for carried in finals])
                for k in self.layout.all]


class ResidentAveraging(_Resident):
    """LocalSGD's averaging of the values `indices` as sync templates (see the module docstring)."""

    def __init__(self, local_sgd, initial, layout, indices):
        super().__init__(layout, initial, set(indices))
        self.replicas, self.every = local_sgd.replicas, local_sgd.sync_every

    def interval(self, r: int) -> int:
        return self.every

    def sync_steps(self, loop, r, n_state):
        first = len(loop.templates)
        if r == 0:
            with loop.step(counts=False) as step:
                state = list(step.carried)
                for k in self.floats:
                    others = [step.receive(f"avg.{j}.{k}", state[k]) for j in range(1, self.replicas)]
                    state[k] = average([state[k]] + others)
                    step.send(state[k], f"mean.{k}")
                step.carry(state)
            return [first]
        with loop.step(counts=False) as step:
            for k in self.floats:
                step.send(step.carried[k], f"avg.{r}.{k}")
            step.carry(step.carried)
        with loop.step(counts=False) as step:
            state = list(step.carried)
            for k in self.floats:
                state[k] = step.receive(f"mean.{k}", state[k])
            step.carry(state)
        return [first, first + 1]


class ResidentGossip(_Resident):
    """Gossip's pair-wise interpolation after every step as sync templates (see the module docstring)."""

    def interval(self, r: int) -> int:
        return 1   # every step

    def __init__(self, gossip, initial, layout, n_steps, graph_seed):
        super().__init__(layout, initial, set())
        self.floats = [k for k in layout.model if initial[k].dtype.is_floating_point]
        self.gossip = gossip
        # peers[r][s]: replica r's peer after s steps (itself when it sits the step out; row 0 is never read)
        self.peers = np.tile(np.arange(gossip.replicas), (n_steps + 1, 1)).T.copy()
        for s in range(1, n_steps + 1):
            for i, j in gossip.pairs(s, graph_seed):
                self.peers[i][s], self.peers[j][s] = j, i

    def sync_steps(self, loop, r, n_state):
        """Replica r's templates: `share` sends its values, `mix` receives the others' and moves towards its peer
        (the loss, when carried, is the state's last value: index `n_state - 1`)."""
        first, replicas, with_loss = len(loop.templates), self.gossip.replicas, self.gossip.needs_loss
        with loop.step(counts=False) as step:
            for k in self.floats:
                step.send(step.carried[k], f"gossip.{r}.{k}")
            if with_loss:
                step.send(step.carried[n_state - 1], f"gossiploss.{r}")
            step.carry(step.carried)
        with loop.step(counts=False) as step:
            state = list(step.carried)
            peer = R.step_row(R.Tensor(self.peers[r].astype(np.int64)), row=0)

            def peers_value(channel, own):
                values = [own if j == r else step.receive(channel.format(j), own) for j in range(replicas)]
                return R.gather(R.stack(values), peer, axis=0)

            shared = self.layout.model
            own = [state[k] for k in shared]
            their = [peers_value(f"gossip.{{}}.{k}", state[k]) if k in self.floats else state[k] for k in shared]
            loss = [state[n_state - 1]] if with_loss else None
            peer_loss = [peers_value("gossiploss.{}", state[n_state - 1])] if with_loss else None
            state[shared.start:shared.stop] = self.gossip.towards(own, their, loss, peer_loss)
            step.carry(state)
        return [first, first + 1]
