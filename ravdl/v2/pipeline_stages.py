"""A model's pipeline stages (Pipeline, ravdl/v2/pipeline_fit.py): its top-level units in forward order, what each
needs in memory, and a `Stage` per contiguous run of them that records its forward with the values given.

A stage's forward runs twice per micro-batch: in its forward segment, and again in its backward segment (GPipe's
re-materialisation). Both must compute the same function, so:
- BatchNorm normalises with the micro-batch's own statistics in train mode, which the recompute finds again from
  the same input; the running statistics are updated by the forward segment only (once per micro-batch, in
  micro-batch order, as torch in train mode), the recompute's are dropped;
- dropout draws from seeds the recording gives both passes (`seed_of(k)`, the k-th random stream's:
  `ravop.parallel.pipeline.stage_seed`, or `stage_stream` in a resident stage's loop), so the recompute, and its
  gradient, use the forward's masks.
"""
from dataclasses import dataclass
from typing import Any, Callable, Sequence, cast

import numpy as np

import ravop as R
from ravop.record.graph_stages import graph_cut, stage_model as graph_stage_model
from ravop.record.torchscript_stages import NotAChain, chain_of, stage_model

from .layers.base import CustomLayer, Layer, Shape, as_input, leaf_layers, recording_calls
from .layers.core import Dropout


@dataclass
class Units:
    """A model's top-level units in forward order: `memory` (bytes a stage holding each needs), `boundary` (bytes
    of each one's output for a micro-batch: what crosses to the next stage), and `stage(start, stop)`."""
    memory: list[int]
    boundary: list[int]
    stage: Callable[[int, int], Any]


class LayerStage:
    """Contiguous top-level layers of a NeuralNetwork."""

    def __init__(self, model: Any, tops: Sequence[Layer]) -> None:
        self.model, self.tops = model, tops
        self.leaves = [leaf for top in tops for _, leaf in leaf_layers(top)]
        self.keys = [(leaf, key) for leaf in self.leaves for key in leaf.params]
        self.buffer_keys = [(leaf, name) for leaf in self.leaves for name in leaf.buffers]
        self.out_shape = tuple(cast(Shape, tops[-1].last_output_shape))   # built: a forward ran

    def params(self) -> list[Any]:
        return [leaf.params[key] for leaf, key in self.keys]

    def set_param(self, k: int, value: Any) -> None:
        leaf, key = self.keys[k]
        leaf.params[key] = value

    def buffers(self) -> list[Any]:
        return [leaf.buffers[name] for leaf, name in self.buffer_keys]

    def set_buffers(self, values: Sequence[Any]) -> None:
        for (leaf, name), value in zip(self.buffer_keys, values):
            leaf.buffers[name] = value

    def optimizer_slots(self) -> list[tuple[Any, Any]]:
        """The optimizer's keys of `params()`, in order."""
        return list(self.keys)

    def counters(self) -> list[tuple[Any, int]]:
        """The layers' Python batch counts (BatchNorm's `num_batches_tracked`), as (layer, count) pairs."""
        return [(leaf, leaf.batches_tracked) for leaf in self.leaves if hasattr(leaf, "batches_tracked")]

    def forward(self, X: Any, buffers: Sequence[Any], seed_of: Callable[[int], int], counts: bool
                ) -> tuple[Any, list[Any]]:
        """(output, buffers after) of a train-mode forward of `X` from `buffers`, the k-th top-level layer's dropout
        mask drawn from `seed_of(k)`;
        the layers keep the buffers they had, and their batch counts unless the pass `counts` (not a recompute)."""
        before = self.buffers()
        tracked = self.counters()
        self.set_buffers(buffers)
        for k, top in enumerate(self.tops):
            if isinstance(top, Dropout):   # x * mask, the mask redrawn from the seed by the recompute
                mask = R.dropout_backward(R.zeros(shape=X.shape, dtype=str(X.dtype).replace("torch.", "")) + 1.0,
                                          p=top.p, seed=seed_of(k))
                X = X * mask
            else:
                X = top._forward_pass(X, training=True)
        after = self.buffers()
        self.set_buffers(before)
        for leaf, count in tracked if not counts else []:
            leaf.batches_tracked = count
        return X, after

    def apply(self, k: int, grad: Any) -> None:
        leaf, key = self.keys[k]
        leaf.params[key] = self.model.optimizer.update((leaf, key), leaf.params[key], grad)


def layer_units(model: Any, tops: Sequence[Layer], rows: int) -> Units:
    """The `Units` of a NeuralNetwork's top-level layers (built), for micro-batches of `rows` rows: parameters
    with their gradients and two optimizer moments, and the layer's output (an estimate: the ops' own
    intermediates are not counted)."""
    for top in tops:
        nested = [leaf for _, leaf in leaf_layers(top) if isinstance(leaf, Dropout) and leaf is not top]
        if nested and isinstance(top, CustomLayer):
            raise NotImplementedError(f"Pipeline of a Dropout inside the custom layer {top.label} is not "
                                      "implemented: a stage's recompute redraws only top-level Dropout layers' "
                                      "masks; make the Dropout a top-level layer")
    params = [4 * sum(p.numel() * p.dtype.itemsize for _, leaf in leaf_layers(top) for p in leaf.params.values())
              for top in tops]
    outputs = [rows * int(np.prod(top.last_output_shape)) * 4 for top in tops]
    return Units([p + o for p, o in zip(params, outputs)], outputs,
                 lambda start, stop: LayerStage(model, tops[start:stop]))


def called_chain(model: Any, sample: Any) -> list[Layer]:
    """The built-in layers a Functional's forward calls, in order, when they form a chain: the first reads the
    model's input, each next one the output of the one before, and the forward returns the last one's output;
    ValueError naming the model and what breaks the chain otherwise. Its forward is recorded once, in eval mode,
    on one row of `sample` (read by nothing, so never run)."""
    X = as_input(sample[:1])
    with recording_calls() as calls:
        out = model._forward_pass(X, training=False)
    name = type(model).__name__
    if not calls:
        raise ValueError(f"{name}'s forward calls no layer: Pipeline has nothing to cut")
    layers: list[Layer] = []
    previous: Any = None
    for layer, read, written in calls:
        expected = X if previous is None else previous
        if read is not expected and not (previous is None and read.inputs and read.inputs[0] is X):
            what = f"the output of {layers[-1].label}" if layers else "the model's input"
            raise ValueError(f"{name} is not a chain of its layers: {layer.label} reads {read.op} ({read.source}), "
                             f"not {what}; Pipeline cuts a forward that only calls its layers one after the other "
                             "(make that step a layer, e.g. Activation)")
        if any(layer is seen for seen in layers):
            raise ValueError(f"{name} calls layer {layer.label} twice; Pipeline cannot put its weights in two stages")
        layers.append(layer)
        previous = written
    if out is not previous:
        raise ValueError(f"{name} is not a chain of its layers: its forward returns {getattr(out, 'op', out)}, not "
                         f"the output of its last layer {layers[-1].label}")
    trained = [leaf for _, leaf in model.leaf_layers() if leaf.params and all(leaf is not l for l in layers)]
    if trained:
        raise ValueError(f"{name}'s layers {[leaf.label for leaf in trained]} have parameters but its forward does "
                         "not call them: Pipeline would not train them")
    return layers


class TorchStage:
    """Contiguous units of a Pytorch_Model (top-level children, ravop.record.torchscript_stages, or a slice of its
    traced graph, ravop.record.graph_stages), run as a model of their own on the full model's values: `built` is
    (the stage's Model, the full model's parameter indices in its slot order, its buffer indices)."""

    def __init__(self, model: Any, built: tuple[Any, list[int], list[int]], out_shape: tuple[int, ...]) -> None:
        self.model = model
        self.code, self.param_index, self.buffer_index = built
        trained = set(i for i, wanted in enumerate(model.model.requires_grad) if wanted)
        self.keys = [i for i in self.param_index if i in trained]
        self.out_shape = out_shape

    def params(self) -> list[Any]:
        return [self.model.params[i] for i in self.keys]

    def set_param(self, k: int, value: Any) -> None:
        self.model.params[self.keys[k]] = value

    def buffers(self) -> list[Any]:
        return [self.model.buffers[i] for i in self.buffer_index]

    def set_buffers(self, values: Sequence[Any]) -> None:
        for i, value in zip(self.buffer_index, values):
            self.model.buffers[i] = value

    def optimizer_slots(self) -> list[tuple[Any, Any]]:
        return [(self.model, i) for i in self.keys]

    def counters(self) -> list[tuple[Any, int]]:
        return []   # a TorchScript model's num_batches_tracked are buffers, carried as the others

    def forward(self, X: Any, buffers: Sequence[Any], seed_of: Callable[[int], int], counts: bool
                ) -> tuple[Any, list[Any]]:
        out, after = self.code.forward([self.model.params[i] for i in self.param_index], list(buffers), [X],
                                       training=True, seed=seed_of(0))
        return out, after

    def apply(self, k: int, grad: Any) -> None:
        i = self.keys[k]
        self.model.params[i] = self.model.optimizer.update((self.model, i), self.model.params[i], grad)


def torch_units(model: Any, sample: Any) -> Units:
    """The `Units` of a Pytorch_Model, measured on `sample` (a micro-batch, a torch tensor): its children when its
    forward is a chain of them, else the pieces of the torch.fx trace of the nn.Module given to R.model."""
    try:
        units = chain_of(model.model, sample)
    except NotAChain as refusal:
        if model.model.module is None:
            raise NotAChain(f"{refusal}; or give R.model the nn.Module itself, whose graph Pipeline cuts at any "
                            "point") from None
        cut = graph_cut(model.model.module, sample)
        return Units(cut.memory, cut.boundary, lambda start, stop: TorchStage(
            model, graph_stage_model(model.model, cut, start, stop), cut.out_shape[stop - 1]))
    return Units([unit.memory for unit in units], [unit.output_bytes for unit in units],
                 lambda start, stop: TorchStage(model, stage_model(model.model, units[start:stop], start > 0),
                                                units[stop - 1].output_shape))
