"""RavDL layers: default initialisation equals the torch module's, and 20 training steps of each layer with
Adam and RMSprop give the losses and weights of the same model in eager PyTorch (same initial weights, same
batches) to 1e-5. The recorded programs run in-process here (`ravop.runtime.evaluate.evaluate`); the engine runs
the same programs in tests/ravdl/test_ravdl_engine.py."""
import math

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

from ravdl.v2 import NeuralNetwork
from ravdl.v2.layers import (Activation, BatchNormalization1D, BatchNormalization2D, Conv2D, Dense, Dropout,
                             Embedding, Flatten, LayerNormalization, MaxPooling2D)
from ravdl.v2.layers.init import layer_seed
from ravdl.v2.optimizers import Adam, AdamW, RMSprop
import ravop as R
from ravop.runtime.evaluate import evaluate

STEPS = 20


# ------------------------------------------------------------------------------ the same model on both sides

def twin(module):
    """The RavDL layer equivalent to a torch module, starting from the module's current weights."""
    if isinstance(module, nn.Linear):
        return Dense(module.out_features, initial_W=module.weight, initial_w0=module.bias,
                     use_bias=module.bias is not None)
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
        kwargs = dict(momentum=module.momentum, epsilon=module.eps, affine=module.affine,
                      initial_gamma=module.weight, initial_beta=module.bias,
                      initial_running_mean=module.running_mean, initial_running_var=module.running_var)
        if isinstance(module, nn.BatchNorm2d):
            return BatchNormalization2D(module.num_features, **kwargs)
        return BatchNormalization1D(**kwargs)
    if isinstance(module, nn.Conv2d):
        return Conv2D(module.in_channels, module.out_channels, module.kernel_size, stride=module.stride,
                      padding=module.padding, dilation=module.dilation, groups=module.groups,
                      bias=module.bias is not None, padding_mode=module.padding_mode, initial_W=module.weight,
                      initial_w0=module.bias)
    if isinstance(module, nn.MaxPool2d):
        return MaxPooling2D(module.kernel_size, stride=module.stride, padding=module.padding,
                            dilation=module.dilation, ceil_mode=module.ceil_mode)
    if isinstance(module, nn.LayerNorm):
        return LayerNormalization(module.normalized_shape, epsilon=module.eps, initial_W=module.weight,
                                  initial_w0=module.bias)
    if isinstance(module, nn.Embedding):
        return Embedding(module.num_embeddings, module.embedding_dim, initial_W=module.weight)
    if isinstance(module, nn.Dropout):
        return Dropout(module.p)
    if isinstance(module, nn.Flatten):
        return Flatten(module.start_dim, module.end_dim)
    if isinstance(module, nn.Tanh):
        return Activation("tanh")
    if isinstance(module, nn.ReLU):
        return Activation("relu")
    raise TypeError(module)


def batches(input_shape, n_out, loss, n=STEPS, batch=32, vocab=None):
    """`n` batches whose targets a fixed random teacher computes from the inputs, so the loss can fall."""
    generator = torch.Generator().manual_seed(3)
    n_in = math.prod(input_shape)
    teacher = torch.randn(n_in, n_out, generator=generator)
    out = []
    for _ in range(n):
        if vocab:
            x = torch.randint(0, vocab, (batch,) + input_shape, generator=generator)
        else:
            x = torch.randn((batch,) + input_shape, generator=generator)
        score = x.reshape(batch, n_in).float() @ teacher
        y = score.argmax(1) if loss == "CrossEntropy" else torch.tanh(score / math.sqrt(n_in))
        out.append((x, y))
    return out


EVAL_OUTPUT = ("eval", "output")   # beside the state: the trained model's output on the first batch, in eval mode


def record_ravdl(modules, make_optimizer, loss, data):
    """Record the training of the RavDL twin of `modules` into the current graph: (loss Ops, {(layer index,
    torch state name): final value Op, EVAL_OUTPUT: the trained model's eval output on the first batch})."""
    model = NeuralNetwork(make_optimizer(), loss=loss)
    for module in modules:
        model.add(twin(module))
    losses = [model.train_on_batch(x, y) for x, y in data]
    state = {(i, key): op for i, layer in enumerate(model.layers) for key, op in layer.state().items()}
    return losses, {**state, EVAL_OUTPUT: model.predict(data[0][0])}


def train_ravdl(modules, make_optimizer, loss, data):
    """Losses and final state of the RavDL twin of `modules`, run in-process."""
    R.Graph(name="parity")
    losses, state = record_ravdl(modules, make_optimizer, loss, data)
    values = evaluate(losses + list(state.values()))
    return torch.stack(values[:len(losses)]), dict(zip(state, values[len(losses):]))


def train_torch(modules, make_optimizer, loss, data):
    model = nn.Sequential(*modules)
    optimizer = make_optimizer(model.parameters())
    losses = []
    for x, y in data:
        out = model(x)
        value = TF.cross_entropy(out, y) if loss == "CrossEntropy" else TF.mse_loss(out, y)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        losses.append(value.detach())
    state = {(i, key): v.detach() for i, m in enumerate(modules) for key, v in m.state_dict().items()
             if key != "num_batches_tracked"}
    with torch.no_grad():
        state[EVAL_OUTPUT] = model.eval()(data[0][0])
    model.train()
    return torch.stack(losses), state


OPTIMIZERS = {
    "adam": (lambda: Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    "rmsprop": (lambda: RMSprop(lr=0.01, momentum=0.5, centered=True),
                lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, foreach=False)),
}

# name -> (torch modules, input shape, outputs, loss, vocabulary for integer inputs).
# A layer feeding batch norm has no bias: batch norm subtracts the mean, so that bias's gradient is zero up to
# rounding, and Adam's normalised step turns rounding noise into full-size updates that no two kernel orders
# (in-process vs a worker's thread count) agree on.
LAYER_CASES = {
    "dense": (lambda: [nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)], (5,), 3, "SquareLoss", None),
    "dense_no_bias": (lambda: [nn.Linear(5, 8, bias=False), nn.ReLU(), nn.Linear(8, 3)], (5,), 3, "CrossEntropy",
                      None),
    "batchnorm1d": (lambda: [nn.Linear(5, 8, bias=False), nn.BatchNorm1d(8, eps=0.01, momentum=0.99),
                             nn.Linear(8, 3)],
                    (5,), 3, "SquareLoss", None),
    "batchnorm1d_3d": (lambda: [nn.BatchNorm1d(4, eps=0.01, momentum=0.3), nn.Flatten(), nn.Linear(12, 3)],
                       (4, 3), 3, "SquareLoss", None),
    "batchnorm2d": (lambda: [nn.Conv2d(2, 4, 3, bias=False), nn.BatchNorm2d(4, eps=0.01, momentum=0.99),
                             nn.Flatten(), nn.Linear(4 * 4 * 4, 3)], (2, 6, 6), 3, "CrossEntropy", None),
    "conv2d": (lambda: [nn.Conv2d(2, 4, 3, padding="same", padding_mode="reflect"), nn.ReLU(),
                        nn.Conv2d(4, 4, (3, 2), stride=2, dilation=(1, 2), groups=2, padding=1), nn.Flatten(),
                        nn.Linear(4 * 3 * 3, 3)], (2, 6, 6), 3, "SquareLoss", None),
    "maxpool2d": (lambda: [nn.Conv2d(1, 3, 3, padding=1), nn.MaxPool2d(2), nn.MaxPool2d(2, stride=1, padding=1,
                                                                                        ceil_mode=True),
                           nn.Flatten(), nn.Linear(3 * 4 * 4, 3)], (1, 6, 6), 3, "CrossEntropy", None),
    "layernorm": (lambda: [nn.Linear(5, 8), nn.LayerNorm(8), nn.Linear(8, 3)], (5,), 3, "SquareLoss", None),
    "embedding": (lambda: [nn.Embedding(10, 6), nn.Flatten(), nn.Linear(4 * 6, 3)], (4,), 3, "CrossEntropy", 10),
    "dropout_p0": (lambda: [nn.Linear(5, 8), nn.Dropout(0.0), nn.Linear(8, 3)], (5,), 3, "SquareLoss", None),
}


def parity_case(case):
    """(torch modules with their initial weights, batches, loss) of a LAYER_CASES entry."""
    make_modules, input_shape, n_out, loss, vocab = LAYER_CASES[case]
    torch.manual_seed(0)
    modules = make_modules()
    for module in modules:   # non-trivial affine parameters, so that a mix-up would show
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm)):
            with torch.no_grad():
                for tensor in (module.weight, module.bias):
                    tensor.add_(torch.rand(tensor.shape) * 0.5)
    return modules, batches(input_shape, n_out, loss, vocab=vocab), loss


def assert_same_training(got_losses, got_state, want_losses, want_state, label):
    assert want_losses[-5:].mean() < want_losses[:5].mean()   # it trains, so the comparison means something
    torch.testing.assert_close(got_losses, want_losses, rtol=0, atol=1e-5, msg=f"{label} losses")
    assert got_state.keys() == want_state.keys()
    for key in want_state:
        torch.testing.assert_close(got_state[key], want_state[key], rtol=0, atol=1e-5, msg=f"{label} {key}")


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_training_matches_eager_pytorch(case, optimizer):
    modules, data, loss = parity_case(case)
    ravdl_opt, torch_opt = OPTIMIZERS[optimizer]
    got_losses, got_state = train_ravdl(modules, ravdl_opt, loss, data)
    want_losses, want_state = train_torch(modules, torch_opt, loss, data)
    assert_same_training(got_losses, got_state, want_losses, want_state, f"{case} {optimizer}")


def test_other_optimizer_settings_match_torch():
    """AdamW, Adam with amsgrad and weight decay, and RMSprop's defaults (no momentum, not centered)."""
    for ravdl_opt, torch_opt in ((lambda: AdamW(lr=0.02), lambda p: torch.optim.AdamW(p, lr=0.02)),
                                 (lambda: RMSprop(), lambda p: torch.optim.RMSprop(p, foreach=False)),
                                 (lambda: Adam(lr=0.02, weight_decay=0.1, amsgrad=True),
                                  lambda p: torch.optim.Adam(p, lr=0.02, weight_decay=0.1, amsgrad=True)),
                                 (lambda: AdamW(lr=0.02, fused=True), lambda p: torch.optim.AdamW(p, lr=0.02, fused=True))):
        torch.manual_seed(1)
        modules = [nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)]
        data = batches((5,), 3, "SquareLoss", n=10)
        got_losses, got_state = train_ravdl(modules, ravdl_opt, "SquareLoss", data)
        want_losses, want_state = train_torch(modules, torch_opt, "SquareLoss", data)
        torch.testing.assert_close(got_losses, want_losses, rtol=0, atol=1e-5)
        for key in want_state:
            torch.testing.assert_close(got_state[key], want_state[key], rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------ initialisation

def built(layer, input_shape, graph_seed=0):
    R.Graph(name="init", seed=graph_seed)
    layer._forward_pass(torch.zeros((2,) + input_shape, dtype=torch.int64 if isinstance(layer, Embedding)
                                    else torch.float32), training=False)
    return {key: evaluate(op) for key, op in layer.state().items()}


@pytest.mark.parametrize("layer, module, input_shape", [
    (lambda: Dense(7), lambda: nn.Linear(5, 7), (5,)),
    (lambda: Conv2D(4, 6, 3, groups=2), lambda: nn.Conv2d(4, 6, 3, groups=2), (4, 5, 5)),
    (lambda: Embedding(11, 5), lambda: nn.Embedding(11, 5), (3,)),
    (lambda: LayerNormalization(), lambda: nn.LayerNorm(6), (4, 6)),
    (lambda: BatchNormalization2D(3), lambda: nn.BatchNorm2d(3), (3, 4, 4)),
])
def test_default_initialisation_is_the_torch_modules(layer, module, input_shape):
    """The first layer built in a graph with seed s draws exactly what the torch module draws after
    torch.manual_seed(layer_seed(s, 0))."""
    got = built(layer(), input_shape, graph_seed=5)
    torch.manual_seed(layer_seed(5, 0))
    want = {k: v for k, v in module().state_dict().items() if k != "num_batches_tracked"}
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)


def test_initialisation_depends_on_graph_seed_and_position():
    a = built(Dense(4), (3,), graph_seed=0)["weight"]
    assert torch.equal(a, built(Dense(4), (3,), graph_seed=0)["weight"])   # reproducible
    assert not torch.equal(a, built(Dense(4), (3,), graph_seed=1)["weight"])
    R.Graph(name="two layers")
    first, second = Dense(4), Dense(4)
    first._forward_pass(torch.zeros(2, 3))
    second._forward_pass(torch.zeros(2, 3))
    assert not torch.equal(evaluate(first.params["weight"]), evaluate(second.params["weight"]))
    bound = 1 / math.sqrt(3)
    assert a.abs().max() <= bound


def test_initial_weights_are_the_starting_value_then_trained():
    w, b = torch.arange(6.0).reshape(2, 3) / 10, torch.tensor([0.5, -0.5])
    R.Graph(name="initial")
    model = NeuralNetwork(Adam(lr=0.1))
    model.add(Dense(2, initial_W=w.numpy(), initial_w0=b.tolist(), input_shape=(3,)))
    first = model._forward_pass(torch.ones(1, 3))
    model._backward_pass(R.square_loss(R.t(torch.zeros(1, 2)), first))
    second = model._forward_pass(torch.ones(1, 3))
    got_first, got_second, trained = evaluate([first, second, model.layers[0].params["weight"]])
    torch.testing.assert_close(got_first, torch.ones(1, 3) @ w.T + b)
    assert not torch.equal(trained, w) and not torch.equal(got_second, got_first)


def test_bad_initial_shapes_and_options_are_clear_errors():
    R.Graph(name="errors")
    with pytest.raises(ValueError, match=r"initial_W must have shape \(2, 3\)"):
        Dense(2, initial_W=torch.zeros(3, 2))._forward_pass(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="use_bias"):
        Dense(2, use_bias="yes")
    with pytest.raises(ValueError, match="unknown activation"):
        Activation("swish")
    with pytest.raises(ValueError, match="padding_mode"):
        Conv2D(1, 1, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="in_channels=3"):
        Conv2D(3, 4, 3)._forward_pass(torch.zeros(1, 2, 5, 5))
    with pytest.raises(ValueError, match="num_features=4"):
        BatchNormalization2D(4)._forward_pass(torch.zeros(2, 3, 5, 5))


# ------------------------------------------------------------------------------ options and modes

def test_use_bias_strings_are_honoured():
    R.Graph(name="bias")
    for value, has_bias in (("False", False), (False, False), ("True", True), (True, True)):
        layer = Dense(3, use_bias=value)
        layer._forward_pass(torch.zeros(2, 4))
        assert ("bias" in layer.params) is has_bias
        assert layer.parameter_count((4,)) == 12 + 3 * has_bias


@pytest.mark.parametrize("name", ["relu", "sigmoid", "tanh", "softmax", "leaky_relu", "elu", "selu", "softplus",
                                  "softsign", "tanhshrink", "logsigmoid", "hardshrink", "hardtanh", "softmin",
                                  "softshrink", "threshold"])
def test_every_activation_matches_its_torch_module(name):
    R.Graph(name="activation")
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0)) * 3
    layer = Activation(name)
    got = evaluate(layer._forward_pass(x))
    module_type, kwargs = layer.torch_spec()
    torch.testing.assert_close(got, getattr(nn, module_type)(**kwargs)(x))


def test_activation_params_reach_the_op():
    R.Graph(name="activation params")
    x = torch.randn(4, 5)
    got = evaluate(Activation("leaky_relu", negative_slope=0.3)._forward_pass(x))
    torch.testing.assert_close(got, TF.leaky_relu(x, 0.3))
    with pytest.raises(TypeError, match="negative_slope"):
        Activation("relu", negative_slope=0.3)


def test_batchnorm_moves_running_stats_in_training_and_uses_them_in_eval():
    R.Graph(name="bn modes")
    x = torch.randn(16, 3, 5, generator=torch.Generator().manual_seed(0)) * 2 + 1
    layer = BatchNormalization1D(momentum=0.99, epsilon=0.01)
    train_out = layer._forward_pass(x, training=True)
    eval_out = layer._forward_pass(x, training=False)
    reference = nn.BatchNorm1d(3, eps=0.01, momentum=0.99)
    want_train = reference(x)
    reference.eval()
    want_eval = reference(x)
    got = evaluate([train_out, eval_out, layer.buffers["running_mean"], layer.buffers["running_var"]])
    torch.testing.assert_close(got[0], want_train)
    torch.testing.assert_close(got[1], want_eval)
    torch.testing.assert_close(got[2], reference.running_mean)
    torch.testing.assert_close(got[3], reference.running_var)
    assert layer.batches_tracked == 1


def test_dropout_is_seeded_by_the_graph_and_off_in_eval():
    def masks(seed):
        R.Graph(name="dropout", seed=seed)
        layer = Dropout(0.5)
        x = torch.ones(64, 32)
        return evaluate([layer._forward_pass(x), layer._forward_pass(x), layer._forward_pass(x, training=False)])

    a1, a2, a_eval = masks(0)
    b1, _, _ = masks(0)
    c1, _, _ = masks(1)
    assert torch.equal(a1, b1) and not torch.equal(a1, a2) and not torch.equal(a1, c1)
    assert set(a1.unique().tolist()) == {0.0, 2.0} and 0.4 < (a1 == 0).float().mean() < 0.6
    assert torch.equal(a_eval, torch.ones(64, 32))


def test_a_dropout_mask_is_a_uniform_draw_below_1_minus_p_the_same_for_every_dtype():
    """The mask comes from the generator's uniform draws (the same numbers on any CPU), not from `bernoulli_`,
    which torch draws from MKL on Intel CPUs only: kept where the draw is below 1-p, whatever the dtype."""
    from ravop.ops.nn import _dropout_noise
    shape, p = (200, 300), 0.3
    draws = torch.rand(shape, generator=torch.Generator().manual_seed(11))
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        noise = _dropout_noise(torch.empty(shape, dtype=dtype), p, torch.Generator().manual_seed(11))
        assert noise.dtype == dtype
        assert torch.equal(noise != 0, draws < 1 - p)
        assert torch.equal(noise[noise != 0], torch.full((), 1 / (1 - p), dtype=dtype).expand(int((noise != 0).sum())))
    assert abs((draws < 1 - p).float().mean().item() - (1 - p)) < 0.01   # 60,000 draws: ~5 standard deviations


def test_a_dropout_mask_is_the_same_on_one_thread_or_two():
    from ravop.ops.nn import _dropout_noise
    threads = torch.get_num_threads()
    try:
        masks = []
        for count in (1, 2):
            torch.set_num_threads(count)
            masks.append(_dropout_noise(torch.empty(1_000_003), 0.3, torch.Generator().manual_seed(5)))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(*masks)


def test_maxpooling_return_indices_gives_values_and_indices():
    R.Graph(name="pool indices")
    x = torch.randn(2, 3, 6, 6)
    values, indices = MaxPooling2D(2, return_indices=True)._forward_pass(x)
    got_values, got_indices = evaluate([values, indices])
    want_values, want_indices = TF.max_pool2d(x, 2, return_indices=True)
    assert torch.equal(got_values, want_values) and torch.equal(got_indices, want_indices)


@pytest.mark.parametrize("layer, module, input_shape", [
    (lambda: Conv2D(3, 8, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1)),
     lambda: nn.Conv2d(3, 8, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1)), (3, 11, 9)),
    (lambda: Conv2D(3, 6, 4, padding="same", padding_mode="circular"),
     lambda: nn.Conv2d(3, 6, 4, padding="same", padding_mode="circular"), (3, 7, 7)),
    (lambda: MaxPooling2D(3, stride=2, padding=1, dilation=2, ceil_mode=True),
     lambda: nn.MaxPool2d(3, stride=2, padding=1, dilation=2, ceil_mode=True), (2, 9, 10)),
    (lambda: Flatten(2), lambda: nn.Flatten(2), (3, 4, 5)),
    (lambda: Embedding(7, 4), lambda: nn.Embedding(7, 4), (5,)),
])
def test_output_shape_matches_torch(layer, module, input_shape):
    x = torch.randint(0, 7, (2,) + input_shape) if isinstance(module(), nn.Embedding) else torch.randn(
        (2,) + input_shape)
    assert tuple(module()(x).shape[1:]) == layer().output_shape(input_shape)
    R.Graph(name="shape")
    assert tuple(layer()._forward_pass(x).shape[1:]) == layer().output_shape(input_shape)
