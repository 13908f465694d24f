"""The persisted losses of a training graph as arrays (`Losses`), read in one round trip: what R.fetch_losses
(`ravop.client.fetching`), History and the dashboard return. Their names are spelled in `ravop.core.loss_names`."""
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..core import graph_states
from ..core.errors import GraphStateError, RavopError
from ..core.loss_names import STEP_RULE, TRAINING_BATCH, TRAINING_BATCH_RULE, TRAINING_STEP, VALIDATION, VALIDATION_RULE
from ..core.persist_rules import PersistRule
from ..store import GraphKeys
from ..store.client_types import Client
from ..store.loss_reads import read_losses
from ..store.rule_values import Walked, named
from ..wire.codec import decode_scalars


@dataclass
class Losses:
    """`batch`: one loss per training step in order, NaN where not computed yet (a done fit's losses, named by
    rule, end at the last one computed: a fit of 10**6 epochs stopped after 2 is read in the time of 2); `epoch`:
    the epoch of each step (0 for losses named by step only); `validation`: one per epoch (index e-1), NaN where
    not computed;
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


def read(client: Client, keys: GraphKeys, padded: bool = True) -> Losses:
    """`Losses` of the graph at `keys`, in one round trip. A graph not done has its losses by rule span all of
    their runs (`losses_of`): arrays of 5 million entries for a fit of 10**6 epochs of 5 steps, built in numpy
    (0.14 s) however far it ran; `padded=False` ends them at the last computed (a poller that reads only those)."""
    state, stored, walked = read_losses(client, keys)
    if state is None:
        raise GraphStateError(f"graph {keys.graph_id} is no longer in Redis (flushed?)")
    if state == graph_states.DONE or not padded:   # a done graph's losses by rule end where its loop did
        short = any(len(values) < len(rule.names) for rule, values in walked)
        return losses_of(client, keys, state, {**stored, **named(walked)}, short=short)
    return losses_of(client, keys, state, stored, walked)


def losses_of(client: Client, keys: GraphKeys, state: str, stored: Dict[str, Optional[bytes]],
              walked: Walked = (), short: bool = False) -> Losses:
    """`Losses` of the graph at `keys` in `state` from `stored`: every persisted loss name with its stored value
    (None where not computed), as `ravop.store.loss_reads.read_losses` reads them, and from `walked`, the loss
    rules of a graph not done with the values of their first runs, each spanning all of its runs (NaN past the last
    computed) as arrays built from the rule, not from its names. `short`: a rule's stored losses end before its
    last run (a done graph's stopped early)."""
    if state == graph_states.ACTIVATED:  # as R.fetch_persisting_op: no value before the start, whatever folding computed
        stored = dict.fromkeys(stored)
        walked = [(rule, []) for rule, _ in walked]
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
    batches = [_Part(np.array([order for order, _, _ in steps], dtype=np.int64).reshape(-1, 2),
                     _scalars([(name, data) for _, name, data in steps]), [data is not None for _, _, data in steps])]
    epochs = sorted(validation)
    validations = [_Part(np.array(epochs, dtype=np.int64), _scalars([validation[e] for e in epochs]),
                         [validation[e][1] is not None for e in epochs])]
    for rule, values in walked:
        kind, part = _rule_part(rule, values)
        if kind:
            (batches if kind == "batch" else validations).append(part)
    order, batch, batch_stored = _joined(batches)
    by_epoch, validated, flags = _joined(validations)
    n_epochs = int(by_epoch.max(initial=0))
    epoch_values: np.ndarray = np.full(n_epochs, np.nan)
    validation_stored: np.ndarray = np.zeros(n_epochs, dtype=bool)
    epoch_values[by_epoch - 1], validation_stored[by_epoch - 1] = validated, flags   # NaN where none is persisted
    stopped = None
    if state == graph_states.DONE and (short or not batch_stored.all()):
        stopped = client.hget(keys.meta, "stopped_step")   # a done graph lacks losses only if stopped early
    return Losses(keys.graph_id, state, batch=batch, epoch=order[:, 0],
                  validation=epoch_values, stopped_step=None if stopped is None else int(stopped),
                  batch_stored=batch_stored, validation_stored=validation_stored)


class _Part:
    """Losses of one source (the names given one by one, or a rule): `order` (epoch, batch) rows of the steps,
    or the epochs of validation losses; their values (NaN where not computed) and whether each was. `grid`: a
    training rule's (epochs, batches), whose losses lie epoch-major on that grid."""
    __slots__ = ("order", "values", "stored", "grid")

    def __init__(self, order: np.ndarray, values: Any, stored: Any, grid: Optional[Tuple[range, range]] = None) -> None:
        self.order, self.grid = order, grid
        self.values = np.asarray(values, dtype=np.float64)
        self.stored = np.asarray(stored, dtype=bool)


def _rule_part(rule: PersistRule, values: List[bytes]) -> Tuple[str, Any]:
    """("batch" or "validation", its `_Part`) of a loss rule of a known template (else ("", None)), from the
    values of its first runs, spanning all of its runs."""
    names = rule.names
    runs = len(names)
    computed = np.full(runs, np.nan)
    computed[:len(values)] = _scalars(list(zip(names[:len(values)], values)))
    stored = np.arange(runs) < len(values)
    epochs: np.ndarray = np.repeat(np.arange(names.epochs.start, names.epochs.stop, dtype=np.int64), len(names.batches))
    if names.template == VALIDATION_RULE:
        return "validation", _Part(epochs, computed, stored)
    if names.template == TRAINING_BATCH_RULE:
        batches = np.tile(np.arange(names.batches.start, names.batches.stop, dtype=np.int64), len(names.epochs))
        return "batch", _Part(np.stack([epochs, batches], axis=1), computed, stored, (names.epochs, names.batches))
    if names.template == STEP_RULE:   # by step only: epoch 0, ordered by the step
        return "batch", _Part(np.stack([np.zeros(runs, dtype=np.int64), epochs], axis=1), computed, stored)
    return "", None


def _joined(parts: List[_Part]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, values, stored) of `parts` together, in order (the names given one by one may sit among a rule's)."""
    given = [part for part in parts if len(part.values)]
    grids = [part.grid for part in given]
    if len(given) > 1 and all(grid is not None and grid[0] == grids[0][0] for grid in grids):   # type: ignore[index]
        # a fit's full batches and its short last one: rules of the same epochs, side by side in each epoch (a
        # lexsort of 5 million steps, 10**6 epochs of 5, took a second)
        given = [part for _, part in sorted(zip([grid[1].start for grid in grids], given),   # type: ignore[index]
                                            key=lambda pair: pair[0])]
        epochs = len(grids[0][0])   # type: ignore[index]

        def side_by_side(name: str, width: Tuple[int, ...]) -> np.ndarray:
            return np.concatenate([getattr(part, name).reshape(epochs, -1, *width) for part in given],
                                  axis=1).reshape(-1, *width)
        return side_by_side("order", (2,)), side_by_side("values", ()), side_by_side("stored", ())
    order = np.concatenate([part.order for part in parts])
    values = np.concatenate([part.values for part in parts])
    stored = np.concatenate([part.stored for part in parts])
    if len(given) > 1:
        keys = (order[:, 1], order[:, 0]) if order.ndim == 2 else (order,)
        at = np.lexsort(keys)
        order, values, stored = order[at], values[at], stored[at]
    return order, values, stored
