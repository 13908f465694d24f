"""Acceptance (issue 3): an MLP written with raw ops (linear, relu, cross_entropy_loss, R.grad, adam_step)
trains on sklearn's digits, and its loss curve equals the same model in eager PyTorch (same init, same
batches) to 1e-5.

The training program is recorded once and handed to an executor: any function that takes a list of Ops
and returns their values as tensors: `ravop.runtime.evaluate.evaluate` (in-process), then the real engine
(compiler, Redis, worker processes), through the `execute` fixture.
"""
import torch
import torch.nn.functional as TF
from sklearn.datasets import load_digits

import ravop as R

EPOCHS, BATCH, HIDDEN, LR = 3, 128, 32, 0.01


def dataset():
    digits = load_digits()   # shipped with scikit-learn: no download
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    return x, torch.tensor(digits.target, dtype=torch.int64)


def initial_weights():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, HIDDEN), torch.nn.Linear(HIDDEN, 10)]
    return [t.detach().clone() for layer in layers for t in (layer.weight, layer.bias)]


def batches(n):
    """The same shuffled batches for both runs, one permutation per epoch."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(EPOCHS):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, BATCH):
            yield order[start:start + BATCH]


def record_training(x, y, weights):
    """Record every training step; return the per-batch loss ops in order."""
    params = [R.t(w) for w in weights]
    state = [[R.t(torch.zeros_like(w))] * 3 for w in weights]
    losses = []
    for step, index in enumerate(batches(len(x)), start=1):
        w1, b1, w2, b2 = params
        logits = R.linear(R.relu(R.linear(R.t(x[index]), w1, b1)), w2, b2)
        loss = R.cross_entropy_loss(R.t(y[index]), logits)
        grads = R.grad(loss, params)
        stepped = [R.adam_step(p, g, *s, step=step, lr=LR) for p, g, s in zip(params, grads, state)]
        params = [out[0] for out in stepped]
        state = [list(out[1:]) for out in stepped]
        losses.append(loss)
    w1, b1, w2, b2 = params
    return losses, R.linear(R.relu(R.linear(R.t(x[:100]), w1, b1)), w2, b2)


def train(execute):
    """(loss curve, the trained model's output on 100 rows) of the recorded program, run by
    `execute(list of Ops) -> list of tensors`."""
    R.Graph(name="mlp-digits")
    x, y = dataset()
    losses, output = record_training(x, y, initial_weights())
    *losses, output = execute(losses + [output])
    return torch.stack(losses), output


def eager_training():
    x, y = dataset()
    params = [torch.nn.Parameter(w) for w in initial_weights()]
    optimizer = torch.optim.Adam(params, lr=LR)
    losses = []
    for index in batches(len(x)):
        w1, b1, w2, b2 = params
        loss = TF.cross_entropy(TF.linear(TF.relu(TF.linear(x[index], w1, b1)), w2, b2), y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    w1, b1, w2, b2 = params
    with torch.no_grad():
        return torch.stack(losses), TF.linear(TF.relu(TF.linear(x[:100], w1, b1)), w2, b2)


def test_mlp_loss_curve_equals_eager_pytorch(execute):
    (got, got_output), (want, want_output) = train(execute), eager_training()
    torch.testing.assert_close(got_output, want_output, rtol=0, atol=1e-5)   # the trained model's output
    assert len(got) == EPOCHS * -(-1797 // BATCH)
    assert want[-5:].mean() < 0.5 * want[:5].mean()     # the model does learn
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
