"""The differential matrix's pieces (tests/differential/test_differential*.py): models of every layer kind built three ways
(NeuralNetwork, Functional, Pytorch_Model) beside the same model in eager PyTorch with the same initial values,
optimizers paired with their torch.optim counterparts, and eager training of the same batches.

Each architecture is a list of (ravdl layer, torch module) pairs in order; a ravdl layer's state names are torch's
(`Layer.state()`), so its initial values are copied into its torch module by name. Dropout is there with p=0:
its training masks come from the engine's own generator, which eager's `bernoulli_` cannot reproduce (they are
tested on their own, ravop/ops/nn.py), while its eval mode must be the identity in both.

Eager runs on one thread, as the test workers do: a reduction summed by two threads may round otherwise."""
import copy
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as TF
from torch import nn

import ravop as R
from ravdl.v2 import Functional, NeuralNetwork, Pytorch_Model
from ravdl.v2.layers import (Activation, BatchNormalization1D, BatchNormalization2D, Conv2D, Dense, Dropout, Embedding,
                             Flatten, LayerNormalization, MaxPooling2D)
from ravdl.v2.lr_schedules import StepLR
from ravdl.v2.optimizers import Adam, AdamW, RMSprop
from ravop.runtime.evaluate import evaluate


@dataclass
class Arch:
    """A model architecture: `pairs()` gives fresh (ravdl layer, torch module) pairs; data of `rows` rows."""
    name: str
    pairs: Callable[[], list]
    data: Callable[[int], tuple]
    loss: str           # ravdl's loss name
    eval_rows: int = 10

    def eager_loss(self, out, y):
        return TF.mse_loss(out, y) if self.loss == "SquareLoss" else TF.cross_entropy(out, y)


def _regression(rows):
    g = torch.Generator().manual_seed(11)
    return torch.randn(rows, 6, generator=g), torch.randn(rows, 3, generator=g)


def _images(rows):
    g = torch.Generator().manual_seed(12)
    return torch.randn(rows, 1, 8, 8, generator=g), torch.randint(0, 10, (rows,), generator=g)


def _tokens(rows):
    g = torch.Generator().manual_seed(13)
    return torch.randint(0, 20, (rows, 5), generator=g), torch.randint(0, 4, (rows,), generator=g)


ARCHS = {
    # a bias before batch norm: its gradient is rounding noise that Adam scales to lr (issue 40's model)
    "mlp_bn": Arch("mlp_bn", lambda: [
        (Dense(12, input_shape=(6,)), nn.Linear(6, 12)),
        (BatchNormalization1D(momentum=0.1, epsilon=1e-5), nn.BatchNorm1d(12)),
        (Activation("tanh"), nn.Tanh()),
        (Dropout(0.0), nn.Dropout(0.0)),
        (Dense(3), nn.Linear(12, 3)),
    ], _regression, "SquareLoss"),
    "cnn_bn": Arch("cnn_bn", lambda: [
        (Conv2D(1, 4, 3, padding="same", input_shape=(1, 8, 8)), nn.Conv2d(1, 4, 3, padding="same")),
        (BatchNormalization2D(4, momentum=0.1, epsilon=1e-5), nn.BatchNorm2d(4)),
        (Activation("relu"), nn.ReLU()),
        (MaxPooling2D(2), nn.MaxPool2d(2)),
        (Flatten(), nn.Flatten()),
        (Dense(10), nn.Linear(64, 10)),
    ], _images, "CrossEntropy"),
    "embed_ln": Arch("embed_ln", lambda: [
        (Embedding(20, 8, input_shape=(5,)), nn.Embedding(20, 8)),
        (LayerNormalization(), nn.LayerNorm(8)),
        (Activation("softplus"), nn.Softplus()),
        (Flatten(), nn.Flatten()),
        (Dense(4), nn.Linear(40, 4)),
        (Activation("sigmoid"), nn.Sigmoid()),
    ], _tokens, "CrossEntropy"),
}


@dataclass
class Optim:
    name: str
    ravdl: Callable[[], object]
    eager: Callable[[list], tuple]    # params -> (torch optimizer, scheduler or None)


def _scheduled(optimizer, **schedule):
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, **schedule)


OPTIMS = {
    "adam": Optim("adam", lambda: Adam(lr=0.01), lambda p: (torch.optim.Adam(p, lr=0.01), None)),
    "adam_fused": Optim("adam_fused", lambda: Adam(lr=0.01, fused=True),
                        lambda p: (torch.optim.Adam(p, lr=0.01, fused=True), None)),
    "adamw_amsgrad_wd": Optim("adamw_amsgrad_wd", lambda: AdamW(lr=0.01, weight_decay=0.1, amsgrad=True),
                              lambda p: (torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, amsgrad=True), None)),
    "adam_steplr": Optim("adam_steplr", lambda: Adam(lr=0.02, weight_decay=0.01, lr_schedule=StepLR(2, 0.5)),
                         lambda p: _scheduled(torch.optim.Adam(p, lr=0.02, weight_decay=0.01), step_size=2,
                                              gamma=0.5)),
    "rmsprop_momentum_centered": Optim(
        "rmsprop_momentum_centered", lambda: RMSprop(lr=0.005, momentum=0.9, centered=True, weight_decay=0.01),
        lambda p: (torch.optim.RMSprop(p, lr=0.005, momentum=0.9, centered=True, weight_decay=0.01,
                                       foreach=False), None)),
}

KINDS = ("sequential", "functional", "pytorch")


class _Chain(Functional):
    """A Functional model over the pairs' layers, as attributes layer0, layer1, ... (state names layerK.weight)."""

    def __init__(self, layers, optimizer):
        super().__init__()
        for k, layer in enumerate(layers):
            setattr(self, f"layer{k}", layer)
        self.n = len(layers)
        self.initialize_params(optimizer)

    def _forward_pass_call(self, input, training=True):
        for k in range(self.n):
            input = getattr(self, f"layer{k}")._forward_pass(input, training=training)
        return input


@dataclass
class Built:
    """A ravdl model of one kind and its eager twin with the same initial values."""
    kind: str
    model: object
    eager: nn.Module
    state: Callable[[], dict] = field(default=None)   # the model's current values, by the eager state_dict name
    saved_names: dict = field(default_factory=dict)    # eager state_dict name -> the saved model's name

    def forward(self, X, training=True):
        return self.model._forward_pass(R.t(X), training=training)


def build(arch, optim, kind, sample):
    """`arch` built as `kind` with `optim` in the current graph, and an eager twin holding the same initial
    values (`sample`: a batch, which builds the ravdl layers)."""
    torch.manual_seed(5)   # the torch modules' initial values (copied into a Pytorch_Model)
    pairs = arch.pairs()
    eager = nn.Sequential(*[module for _, module in pairs])
    if kind == "pytorch":
        model = Pytorch_Model(R.model(copy.deepcopy(eager)))
        model.initialize(optim.ravdl())
        names = ([n for n, _ in eager.named_parameters()], [n for n, _ in eager.named_buffers()])

        def state():
            return dict(zip(names[0] + names[1], model.params + model.buffers))
        return Built(kind, model, eager, state)
    layers = [layer for layer, _ in pairs]
    if kind == "sequential":
        model = NeuralNetwork(optim.ravdl(), loss=arch.loss)
        for layer in layers:
            model.add(layer)
    else:
        model = _Chain(layers, optim.ravdl())
    model._forward_pass(R.t(sample), training=False)   # builds the layers (eval mode: no state moves)

    def state():
        return {f"{k}.{name}": op for k, layer in enumerate(layers) for name, op in layer.state().items()}
    initial = state()
    values = dict(zip(initial, evaluate(list(initial.values()))))
    eager.load_state_dict(values, strict=False)
    leaf = {id(layer): name for name, layer in model.leaf_layers()}
    saved_names = {f"{k}.{key}": f"{leaf[id(layer)]}.{key}" for k, (layer, module) in enumerate(pairs)
                   for key in module.state_dict()}
    return Built(kind, model, eager, state, saved_names)


def loss_op(arch, built, X, y):
    out = built.forward(X)
    target = R.t(y)
    return R.square_loss(target, out) if arch.loss == "SquareLoss" else R.cross_entropy_loss(target, out)


def record_steps(arch, built, batches):
    """Hand-written training steps over `batches`; returns the loss Ops (each computed before its step)."""
    losses = []
    for X, y in batches:
        loss = loss_op(arch, built, X, y)
        built.model._backward_pass(loss)
        losses.append(loss)
    return losses


class EagerTraining:
    """`eager` trained by `optim`'s torch counterpart, on one thread; `steps(batches)` returns the losses, each
    before its step, and can be called again to go on."""

    def __init__(self, arch, optim, eager):
        self.arch, self.eager = arch, eager
        self.optimizer, self.schedule = optim.eager(list(eager.parameters()))

    def steps(self, batches):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            self.eager.train()
            losses = []
            for X, y in batches:
                self.optimizer.zero_grad()
                loss = self.arch.eager_loss(self.eager(X), y)
                loss.backward()
                self.optimizer.step()
                if self.schedule is not None:
                    self.schedule.step()
                losses.append(loss.detach())
            return torch.stack(losses)
        finally:
            torch.set_num_threads(threads)


def eager_eval(eager, X):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eager.eval()
        with torch.no_grad():
            return eager(X)
    finally:
        eager.train()
        torch.set_num_threads(threads)


def batches_of(arch, n_steps, batch=16):
    X, y = arch.data(n_steps * batch)
    return [(X[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]) for i in range(n_steps)]


def eager_state(eager):
    """The eager model's state_dict without BatchNorm's batch counts (not graph tensors of ravdl's layers)."""
    return {k: v for k, v in eager.state_dict().items() if not k.endswith("num_batches_tracked")}


def differences(got, want):
    """{name: max abs difference} of the entries that are not bit-equal (NaN-aware); {} when all are."""
    out = {}
    for name, w in want.items():
        g = torch.as_tensor(got[name])
        if g.shape != w.shape or g.dtype != w.dtype:
            out[name] = f"{tuple(g.shape)} {g.dtype} vs {tuple(w.shape)} {w.dtype}"
        elif not torch.equal(g, w):
            out[name] = float((g.double() - w.double()).abs().max())
    return out


def assert_bit_equal(got, want, what):
    diff = differences(got, want)
    assert not diff, f"{what}: not bit-equal to eager PyTorch: {diff}"


def case_ids(cases):
    return ["-".join(str(c) for c in case) for case in cases]


def numpy_rows(tensor):
    return tensor.numpy() if isinstance(tensor, torch.Tensor) else np.asarray(tensor)
