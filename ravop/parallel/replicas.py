"""What every replicated strategy shares: the replica count, its check, the layout of a replica's carried
values, and averaging recorded as ops."""
from typing import Any, List, Optional

from ..record.forms import RESIDENT, SEGMENTS


class OnShards:
    """The hooks of strategies whose replicas train on shards of the data between synchronisations (LocalSGD,
    Gossip, DiLoCo): the trainer's `replicated` recording, one role per replica."""
    needs_loss = False   # whether a segment carries its last loss for the exchange
    update_frequency = 1  # batches whose gradients are summed into one optimizer step (Ravnest's knob)

    def record_fit(self, fit):
        return fit.replicated(self)

    def roles(self):
        return [f"replica {r}" for r in range(self.replicas)]

    resident = None       # resident replicas: None (when the workers can hold them all), True or False

    def shard_rows(self, n_rows: int, rows_per_step: int) -> List[int]:
        """Rows of each replica's shard: equal shards (every replica runs the same steps)."""
        if n_rows % self.replicas:
            raise ValueError(f"{n_rows} rows do not split into {self.replicas} equal shards: replicas that run "
                             "different numbers of steps could not synchronise; give a multiple of the number of "
                             "replicas")
        return [n_rows // self.replicas] * self.replicas

    def resident_forms(self):
        """The forms the replicas are recorded in (ravop/record/forms.py): resident (one loop per replica for the
        whole fit, `resident_templates`), segments (synchronised by `synchronizer`), or both for resident=None,
        the session choosing at activation: resident when its live workers can hold every replica at once."""
        return [RESIDENT] if self.resident else [SEGMENTS] if self.resident is False else [RESIDENT, SEGMENTS]


def check_resident(resident):
    if resident is not None and not isinstance(resident, bool):
        raise TypeError(f"resident takes None (when the workers can hold every replica), True or False, not "
                        f"{resident!r}")
    return resident


def check_update_frequency(update_frequency):
    if type(update_frequency) is not int or update_frequency < 1:
        raise ValueError(f"update_frequency must be a positive int (batches per optimizer step), not "
                         f"{update_frequency!r}")
    return update_frequency


def every(n_steps, interval):
    """(first step, steps) of runs of `interval` steps over `n_steps` (the last one may be shorter)."""
    return [(first, min(interval, n_steps - first)) for first in range(0, n_steps, interval)]


def check_replicas(replicas):
    if type(replicas) is not int or replicas < 1:
        raise ValueError(f"replicas must be a positive int, not {replicas!r}")
    return replicas


class Carried:
    """Where each kind of value sits in a replica's carried values (the model's `TrainState.carried` order):
    trained parameters, then buffers, then optimizer state."""
    __slots__ = ("params", "buffers", "optimizer")

    def __init__(self, n_params, n_buffers, n_optimizer):
        self.params = range(n_params)
        self.buffers = range(n_params, n_params + n_buffers)
        self.optimizer = range(n_params + n_buffers, n_params + n_buffers + n_optimizer)

    @property
    def model(self):
        """Parameters and buffers: what a synchronisation shares (optimizer state stays with its replica)."""
        return range(self.params.start, self.buffers.stop)

    @property
    def all(self):
        return range(self.params.start, self.optimizer.stop)


def weighted_sum(values, weights):
    """sum(w * v), recorded as ops; weights of 1.0 skip their multiplication."""
    total = None
    for value, weight in zip(values, weights):
        term = value if weight == 1.0 else value * float(weight)
        total = term if total is None else total + term
    return total


def weighted_mean(values: List[Any], weights: Optional[List[float]]) -> Any:
    """sum(w * v) with `weights` summing to 1 (replicas weighted by the samples they trained on), or the plain
    `average` when `weights` is None (equal replicas: its bits). Integer values: the first one's (see `average`)."""
    if weights is None or not values[0].dtype.is_floating_point:
        return average(values)
    return weighted_sum(values, weights)


def average(values):
    """The mean of `values` (Ops of one shape), as torch.stack(values).mean(0) computes it for two. Integer
    values are counters the replicas advance alike (BatchNorm's num_batches_tracked): the first one's."""
    if len(values) == 1 or not values[0].dtype.is_floating_point:
        return values[0]
    return weighted_sum(values, [1.0] * len(values)) * (1.0 / len(values))


def average_into(states, indices):
    """Replace value k of every replica's state by the replicas' mean, for k in `indices`."""
    for k in indices:
        if all(state[k] is states[0][k] for state in states):
            continue   # averaged at the last synchronisation already
        mean = average([state[k] for state in states])
        for state in states:
            state[k] = mean


class Averaging:
    """The synchronisation of LocalSGD-like strategies (one per fit, `strategy.synchronizer(...)`): `exchange`
    after each segment, and `finish`: the model after fit, the replicas' mean of every carried value."""

    def __init__(self, indices, layout):
        self.indices, self.layout = indices, layout

    def exchange(self, states, losses, step):
        average_into(states, self.indices)

    def finish(self, states):
        average_into(states, self.layout.all)
        return states[0]
