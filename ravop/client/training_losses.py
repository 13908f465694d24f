"""The persisted losses of a training graph as arrays (`Losses`), read in one round trip: what R.fetch_losses
(`ravop.client.fetching`), History and the dashboard return. Their names are spelled in `ravop.core.loss_names`."""
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..core import graph_states
from ..core.errors import GraphStateError, RavopError
from ..core.loss_names import TRAINING_BATCH, TRAINING_STEP, VALIDATION
from ..store import GraphKeys
from ..store.client_types import Client
from ..store.loss_reads import read_losses
from ..wire.codec import decode_scalars


@dataclass
class Losses:
    """`batch`: one loss per training step in order, NaN where not computed yet; `epoch`: the epoch of each
    step (0 for losses named by step only); `validation`: one per epoch (index e-1), NaN where not computed;
    `state`: the graph's state when they were read; `stopped_step`: the training steps run when a stop request ended
    its training loop (at an epoch boundary), None if none did; `batch_stored`, `validation_stored`: whether each
    loss was computed (a loss the training made NaN is a stored NaN)."""
    graph_id: str
    state: str
    batch: np.ndarray
    epoch: np.ndarray
    validation: np.ndarray
    stopped_step: Optional[int] = None
    batch_stored: Optional[np.ndarray] = None
    validation_stored: Optional[np.ndarray] = None

    def per_epoch(self) -> np.ndarray:
        """The mean batch loss of each epoch (as Keras reports `loss`); NaN for an epoch not fully computed."""
        epochs = np.unique(self.epoch[self.epoch > 0])
        return np.array([self.batch[self.epoch == e].mean() for e in epochs])

    def to_json(self) -> Dict[str, Any]:
        """Plain lists for a JSON reply; a value not computed yet is None."""
        def values(array: np.ndarray) -> List[Optional[float]]:
            return [None if np.isnan(v) else float(v) for v in array]
        return {"graph": self.graph_id, "state": self.state, "batch": values(self.batch),
                "epoch": self.epoch.tolist(), "validation": values(self.validation)}


def _scalars(named: List[Tuple[str, Optional[bytes]]]) -> List[float]:
    """The loss value of each (name, stored bytes or None: NaN), decoded together."""
    stored = [(name, data) for name, data in named if data is not None]
    decoded = iter(decode_scalars([data for _, data in stored]))
    values = []
    for name, data in named:
        if data is None:
            values.append(np.nan)
            continue
        value, shape = next(decoded)
        if math.prod(shape) != 1:
            raise RavopError(f"{name!r} holds a tensor of shape {shape}, not a single loss value")
        values.append(value)
    return values


def read(client: Client, keys: GraphKeys) -> Losses:
    """`Losses` of the graph at `keys`, in one round trip."""
    state, stored = read_losses(client, keys)
    if state is None:
        raise GraphStateError(f"graph {keys.graph_id} is no longer in Redis (flushed?)")
    return losses_of(client, keys, state, stored)


def losses_of(client: Client, keys: GraphKeys, state: str, stored: Dict[str, Optional[bytes]]) -> Losses:
    """`Losses` of the graph at `keys` in `state` from `stored`: every persisted loss name with its stored value
    (None where not computed), as `ravop.store.loss_reads.read_losses` reads them."""
    if state == graph_states.ACTIVATED:  # as R.fetch_persisting_op: no value before the start, whatever folding computed
        stored = dict.fromkeys(stored)
    steps, validation = [], {}
    for name, data in stored.items():
        match = TRAINING_BATCH.match(name)
        if match:
            steps.append(((int(match[1]), int(match[2])), name, data))
            continue
        match = TRAINING_STEP.match(name)
        if match:
            steps.append(((0, int(match[1])), name, data))
            continue
        match = VALIDATION.match(name)
        if match:
            validation[int(match[1])] = (name, data)
    steps.sort(key=lambda step: step[0])
    epochs = [validation.get(e, ("", None)) for e in range(1, max(validation, default=0) + 1)]
    batch_stored = np.array([data is not None for _, _, data in steps], dtype=bool)
    stopped = None
    if state == graph_states.DONE and not batch_stored.all():
        stopped = client.hget(keys.meta, "stopped_step")   # a done graph lacks losses only if stopped early
    return Losses(keys.graph_id, state,
                  batch=np.array(_scalars([(name, data) for _, name, data in steps]), dtype=np.float64),
                  epoch=np.array([order[0] for order, _, _ in steps], dtype=np.int64),
                  validation=np.array(_scalars(epochs)),
                  stopped_step=None if stopped is None else int(stopped), batch_stored=batch_stored,
                  validation_stored=np.array([data is not None for _, data in epochs], dtype=bool))
