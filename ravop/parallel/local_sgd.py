"""LocalSGD (Ravnest's clusters averaged every `reduce_factor` updates): each replica trains on its own shard of
the data (replica r on rows [r * n / replicas, (r + 1) * n / replicas), shuffled within the shard with
`shuffle`, from seed + r); every `sync_every` steps, and after the last one, their parameters (and buffers, and with
`average_optim` the optimizer's moments) are replaced by the replicas' mean.

`update_frequency=k` (Ravnest's): a step is one optimizer update on the gradients of k batches summed, as torch
sums `.grad` over k backward calls; an epoch's last step takes the batches left (fewer than k). `sync_every`
counts such steps, as Ravnest's `reduce_factor` counts updates.

`resident` (None: the session picks at activation, resident where its live workers can hold every replica at
once; True; False): each replica is
one loop op for the whole fit whose state and shard stay where it runs, averaged through replica 0
(ravop.parallel.resident_averaging); otherwise each interval of each replica is a loop segment whose carried
values go through the store. Both give the same bits."""
from .replicas import Averaging, OnShards, check_replicas, check_resident, check_update_frequency, every
from .resident_averaging import ResidentAveraging


class LocalSGD(OnShards):
    def __init__(self, replicas, sync_every, average_optim=False, update_frequency=1, resident=None):
        self.replicas, self.resident = check_replicas(replicas), check_resident(resident)
        self.update_frequency = check_update_frequency(update_frequency)
        if type(sync_every) is not int or sync_every < 1:
            raise ValueError(f"sync_every must be a positive int (steps between averagings), not {sync_every!r}")
        if not isinstance(average_optim, bool):
            raise TypeError(f"average_optim takes True or False, not {average_optim!r}")
        self.sync_every, self.average_optim = sync_every, average_optim

    def segments(self, n_steps, r):
        """(first step, steps) of each replica's run between two averagings (alike for every replica)."""
        return every(n_steps, self.sync_every)

    def synchronizer(self, initial, layout, graph_seed):
        return Averaging(self._averaged(layout), layout)

    def resident_templates(self, initial, layout, n_steps, graph_seed):
        return ResidentAveraging(self, initial, layout, self._averaged(layout))

    def _averaged(self, layout):
        return layout.all if self.average_optim else layout.model

    def __repr__(self):
        frequency = f", update_frequency={self.update_frequency}" if self.update_frequency > 1 else ""
        return (f"LocalSGD(replicas={self.replicas}, sync_every={self.sync_every}, average_optim={self.average_optim}"
                f"{frequency}" + (f", resident={self.resident})" if self.resident is not None else ")"))
