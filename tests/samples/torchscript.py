"""Samples for torchscript_forward and torchscript_vjp (ravop/ops/torchscript.py).

The forward's reference is the eager nn.Module the model was scripted from, called with the sample's
parameter and buffer values (torch.func.functional_call) and the same seeded RNG: training mode with
dropout and BatchNorm (whose updated running stats are extra outputs), eval mode, and a model with a tuple
output and a keyword input. The registry walk's gradient check compares R.grad (torchscript_vjp) with
torch.autograd through the forward kernel; tests/record/test_torchscript.py checks the VJP against eager autograd.
"""
import torch
from torch import nn

from ravop.record.torchscript_import import model as load_model

from . import Sample
from .nn import randn


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(self.drop(torch.tanh(self.bn(self.fc1(x)))))


class TwoHeads(nn.Module):
    """A tuple output, and a keyword tensor input (a mask, as a padding mask reaches a transformer)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 2)

    def forward(self, x, mask: torch.Tensor):
        y = self.proj(x) * mask
        return y, y.sum(1)


def _reference(module, training):
    """The eager module's outputs (and, training, its buffers after the call) for the op's inputs."""
    names = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]

    def reference(blob, *xs, n_args=1, kwarg_names=(), seed=0, **params):
        state = {n: (x.clone() if training else x) for n, x in zip(names, xs)}
        rest = xs[len(names):]
        args, kwargs = rest[:n_args], dict(zip(kwarg_names, rest[n_args:]))
        module.train(training)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = torch.func.functional_call(module, state, args, kwargs)
        out = out if isinstance(out, tuple) else (out,)
        buffers = [state[n] for n, _ in module.named_buffers()]
        return out + tuple(buffers) if training else out
    return reference


def _forward_sample(module, args, kwargs=None, training=True, seed=12345, note=""):
    model = load_model(module)
    kwargs = kwargs or {}
    params = {"model_hash": model.model_hash, "param_slots": model.param_slots, "buffer_slots": model.buffer_slots,
              "n_args": len(args), "kwarg_names": tuple(kwargs), "training": training, "seed": seed}
    inputs = (model.blob, *model.params, *model.buffers, *args, *kwargs.values())
    return model, Sample(inputs, params, reference=_reference(module, training), note=note)


_mlp = Mlp()
with torch.no_grad():  # running stats that are not the defaults, so eval mode reads something
    _mlp.bn.running_mean.copy_(randn(6) * 0.1)
    _mlp.bn.running_var.copy_(randn(6).abs() + 0.5)
_MLP, _TRAIN = _forward_sample(_mlp, (randn(5, 4),), note="training: dropout and BatchNorm stats")
_, _EVAL = _forward_sample(_mlp, (randn(5, 4),), training=False, note="eval mode")
_EVAL.grad = False  # the walk's reference asks torch for running-stat gradients, which BatchNorm refuses
_, _HEADS = _forward_sample(TwoHeads(), (randn(4, 3),), {"mask": (randn(4, 2) > 0).float()}, training=False,
                           note="tuple output, keyword input")


def _vjp_sample():
    inputs = _TRAIN.inputs
    params = {**_TRAIN.params, "mask": (True,) * 6 + (False,) * 3 + (True,), "grad_mask": (True,)}
    return Sample(inputs + (randn(5, 3),), params, note="grads of the params and the input, not the buffers")


SAMPLES = {
    "torchscript_forward": [_TRAIN, _EVAL, _HEADS],
    "torchscript_vjp": [_vjp_sample()],
}
