"""One forward per step for a TorchScript model (issue 46): in a compiled loop step `torchscript_forward` runs under
autograd keeping its graph and `torchscript_vjp` takes its backward from it (`Reuses` in ravop/ops/torchscript.py),
bit for bit the plain step (the VJP recomputing the forward): losses, trained parameters, BatchNorm's running
statistics and the eval output after training, for a residual CNN with BatchNorm and dropout and for a small
decoder-only transformer (attention through F.scaled_dot_product_attention and written out, dropout, LayerNorm)."""
import math
import sys
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import ravop as R
from ravdl.v2 import Pytorch_Model
from ravdl.v2.fit import record_fit as record_fit_step
from ravdl.v2.optimizers import Adam
from ravop.ops import torchscript
from ravop.record.graph import current_graph
from ravop.runtime.evaluate import evaluate
from test_step_compiler import always, reference, tuned_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from real_models import GPT  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


class Block(nn.Module):
    def __init__(self, channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(channels // stride, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.skip = nn.Sequential() if stride == 1 else nn.Sequential(
            nn.Conv2d(channels // stride, channels, 1, stride, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.skip(x))


class ResidualCNN(nn.Module):
    """A resnet-like CNN: a stem, residual blocks with BatchNorm (one downsampling), dropout, a linear head."""

    def __init__(self, width=8, blocks=2, classes=10, dropout=0.3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(*[Block(width * (2 if k else 1), 2 if k else 1) for k in range(blocks)])
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(width * (2 if blocks > 1 else 1), classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(self.drop(TF.adaptive_avg_pool2d(x, 1).flatten(1)))


def tiny_gpt(fused):
    """benchmarks/real_models.py's GPT, tiny: vocabulary 32, sequences of 8, d_model 16, 2 heads, 2 blocks."""
    return GPT(vocab=32, seq=8, d_model=16, heads=2, layers=2, dropout=0.1, fused=fused)


def images(rows=40, size=8):
    g = torch.Generator().manual_seed(21)
    return torch.randn(rows, 3, size, size, generator=g), torch.randint(0, 10, (rows,), generator=g)


def tokens(rows=20, seq=8, vocab=32):
    g = torch.Generator().manual_seed(22)
    x = torch.randint(0, vocab, (rows, seq + 1), generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def token_loss(vocab):
    return lambda y_true, y_pred: R.cross_entropy_loss(y_true, y_pred, reshape_target=(-1, vocab),
                                                       reshape_label=(-1,))


def record_fit(name, net, X, y, loss, epochs=2, batch=16):
    """A Pytorch_Model of `net` fitted on (X, y) in a loop (two templates: full batches and the short last one),
    then its parameters, buffers and eval output persisted: (graph, the persisted names)."""
    graph = R.Graph(name=name, seed=7)
    model = Pytorch_Model(R.model(net))
    model.initialize(Adam(lr=0.01))
    names = list(model.fit(X, y, n_epochs=epochs, batch_size=batch, loss=loss, shuffle=True))
    for k, value in enumerate(model.params + model.buffers):
        value.persist_op(f"state_{k}")
        names.append(f"state_{k}")
    model._forward_pass(R.t(X[:4]), training=False).persist_op("prediction")
    return graph, names + ["prediction"]


def counting_runs(monkeypatch):
    """The calls of the model a TorchScript op makes (`torchscript._run`), counted in a list of one."""
    calls = [0]
    real = torchscript._run

    def run(*args):
        calls[0] += 1
        return real(*args)
    monkeypatch.setattr(torchscript, "_run", run)
    return calls


def frozen_stem():
    """A ResidualCNN whose stem convolution is frozen: the VJP differentiates only some of the parameters."""
    net = ResidualCNN()
    net.stem[0].weight.requires_grad_(False)
    return net


MODELS = {
    "residual_cnn": lambda: (ResidualCNN(), *images(), "CrossEntropy"),
    "residual_cnn_frozen_stem": lambda: (frozen_stem(), *images(), "CrossEntropy"),
    "gpt_sdpa": lambda: (tiny_gpt(fused=True), *tokens(), token_loss(32)),
    "gpt_written_out": lambda: (tiny_gpt(fused=False), *tokens(), token_loss(32)),
}


@pytest.mark.parametrize("model", MODELS)
def test_the_compiled_step_runs_the_forward_once_with_the_plain_steps_bits(model, monkeypatch):
    torch.manual_seed(3)
    net, X, y, loss = MODELS[model]()
    graph, names = record_fit(f"one forward {model}", net, X, y, loss)
    calls = counting_runs(monkeypatch)
    plain = reference(graph, names, monkeypatch)
    plain_calls, calls[0] = calls[0], 0
    compiled, made = tuned_run(monkeypatch, graph, names, always(True))
    rewrites = [tuned.compiled.rewrites for tuned in made]
    assert len(rewrites) == 2 and all(r["torchscript_graphs_kept"] == 1 for r in rewrites), rewrites
    steps = 2 * math.ceil(len(X) / 16)   # 2 epochs in batches of 16
    assert plain_calls - calls[0] == steps, (plain_calls, calls[0])   # the VJP's forward, once per step
    for name in names:
        assert torch.equal(compiled[name], plain[name]), name


def recorded_vjp(net, x):
    """(forward inputs, output gradients, params of the VJP) of `net` on `x` in training mode, as values."""
    R.Graph(name="kept vjp")
    model = Pytorch_Model(R.model(net))
    out = model._forward_pass(R.t(x))
    R.grad(R.sum(out * out), model.params)
    vjp = next(op for op in current_graph().nodes if op.op == "torchscript_vjp")
    n_grads = sum(vjp.params["grad_mask"])
    values = evaluate(list(vjp.inputs))
    return tuple(values[:len(values) - n_grads]), tuple(values[len(values) - n_grads:]), dict(vjp.params)


def forward_params(params):
    return {k: v for k, v in params.items() if k not in ("mask", "grad_mask")}


def test_a_vjp_takes_the_kept_graph_once_and_frees_it():
    torch.manual_seed(4)
    xs, grads, params = recorded_vjp(ResidualCNN(), images(4)[0])
    want = torchscript.torchscript_vjp(*xs, *grads, **params)
    box = torchscript._vjp_box(params)
    outputs = torchscript._forward_keeping(box, *xs, **forward_params(params))
    plain = torchscript.torchscript_forward(*xs, **forward_params(params))
    assert len(outputs) == len(plain) and all(torch.equal(a, b) for a, b in zip(outputs, plain))   # buffers too
    assert not any(o.requires_grad for o in outputs)
    graph_output = weakref.ref(box[1].outputs[0])
    with torch.no_grad():
        got = torchscript._vjp_kept(box, *xs, *grads, **params)
    assert box[1] is None and graph_output() is None, "the kept graph is let go after its backward"
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    # taken once: a second VJP of the same forward (another backward pass) recomputes, as the op
    again = torchscript._vjp_kept(box, *xs, *grads, **params)
    assert all(torch.equal(a, b) for a, b in zip(again, want))


def test_a_vjp_of_other_inputs_or_another_seed_recomputes_as_the_op(monkeypatch):
    torch.manual_seed(5)
    xs, grads, params = recorded_vjp(ResidualCNN(dropout=0.5), images(4)[0])
    want = torchscript.torchscript_vjp(*xs, *grads, **params)
    for changed, vjp_params in (((xs[0], *[x.clone() for x in xs[1:]]), params),   # equal values, not the same
                                (xs, {**params, "seed": params["seed"] + 1})):
        box = torchscript._vjp_box(params)
        torchscript._forward_keeping(box, *changed, **forward_params(params))
        calls = counting_runs(monkeypatch)
        got = torchscript._vjp_kept(box, *xs, *grads, **vjp_params)
        assert calls[0] == 1 and box[1] is None   # recomputed, and the kept graph let go
        if vjp_params is params:
            assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_two_backward_passes_of_one_forward_in_a_step_give_the_plain_bits(monkeypatch):
    """Gradients summed over two losses of one forward (step=False, then step=True): the first VJP is paired with
    the forward and takes its kept graph, the second recomputes the forward, as the plain step does."""
    torch.manual_seed(6)
    net, X, y, _ = MODELS["residual_cnn"]()
    graph = R.Graph(name="two backward passes", seed=8)
    model = Pytorch_Model(R.model(net))
    model.initialize(Adam(lr=0.01))

    def train_step(X_batch, y_batch):
        out = model._forward_pass(X_batch)
        first, second = R.cross_entropy_loss(y_batch, out), R.sum(out * out) * 1e-3
        model._backward_pass(first, step=False)
        model._backward_pass(second)
        return first
    names = list(record_fit_step(model, train_step, X, y, n_epochs=2, batch_size=16))
    for k, value in enumerate(model.params + model.buffers):
        value.persist_op(f"state_{k}")
        names.append(f"state_{k}")
    calls = counting_runs(monkeypatch)
    plain = reference(graph, names, monkeypatch)
    plain_calls, calls[0] = calls[0], 0
    compiled, made = tuned_run(monkeypatch, graph, names, always(True))
    assert made and all(tuned.compiled.rewrites["torchscript_graphs_kept"] == 1 for tuned in made)
    assert plain_calls - calls[0] == 2 * math.ceil(len(X) / 16)
    for name in names:
        assert torch.equal(compiled[name], plain[name]), name
