"""R.grad: reverse-mode autodiff recorded as ops, checked against torch.autograd."""
import inspect

import pytest
import torch
import torch.nn.functional as TF

import ravop as R
from ravop.core import registry
from ravop.runtime.evaluate import evaluate, run_op

DT = torch.float64


def randn(*shape, seed=0):
    return torch.randn(*shape, dtype=DT, generator=torch.Generator().manual_seed(seed))


def total(x):
    return R.sum_to(x, shape=())


@pytest.fixture(autouse=True)
def graph():
    return R.Graph(name="autodiff")


def test_value_used_several_times_sums_its_gradients():
    x0 = randn(5)
    x = R.t(x0)
    loss = total(x * x * x + x * 3.0 + R.exp(x))
    got = evaluate(R.grad(loss, x))
    torch.testing.assert_close(got, 3 * x0 ** 2 + 3 + torch.exp(x0), rtol=1e-12, atol=0)


def test_only_nodes_between_wrt_and_loss_are_differentiated(graph):
    x, w, c = R.t(randn(4, 3)), R.t(randn(5, 3, seed=1)), R.t(randn(4, 5, seed=2))
    side = R.tanh(c)                   # feeds the loss but does not depend on w
    R.sigmoid(w)                       # depends on w but does not feed the loss
    loss = total(R.linear(x, w) * side)
    before = len(graph.nodes)
    gw = R.grad(loss, w)
    backward_ops = [node.op for node in graph.nodes[before:]]
    assert "tanh_backward" not in backward_ops and "sigmoid_backward" not in backward_ops
    assert backward_ops.count("linear_backward") == 1
    (linear_backward,) = [n for n in graph.nodes[before:] if n.op == "linear_backward"]
    assert linear_backward.params["mask"] == (False, True, False)   # no gradient for the data x
    x0, c0 = graph.constants[x.id], graph.constants[c.id]
    torch.testing.assert_close(evaluate(gw), torch.tanh(c0).t() @ x0, rtol=1e-12, atol=1e-12)


def test_wrt_structure_and_unused_wrt_gets_zeros():
    a, b, unrelated = R.t(randn(3)), R.t(randn(3, seed=1)), R.t(randn(2, 2, seed=2))
    loss = total(a * b)
    ga, gb, gu = evaluate(list(R.grad(loss, (a, b, unrelated))))
    assert isinstance(R.grad(loss, (a, b)), tuple) and isinstance(R.grad(loss, [a]), list)
    torch.testing.assert_close(ga, randn(3, seed=1))
    torch.testing.assert_close(gb, randn(3))
    assert torch.equal(gu, torch.zeros(2, 2, dtype=DT))


def test_gradient_of_loss_itself_and_of_an_intermediate():
    x = R.t(randn(3))
    y = x * 2.0
    loss = total(y * y)
    gl, gy, gx = evaluate(R.grad(loss, [loss, y, x]))
    assert gl.item() == 1.0
    torch.testing.assert_close(gy, 4 * randn(3))
    torch.testing.assert_close(gx, 8 * randn(3))


def test_multi_output_gradients_are_gathered_per_output():
    x0 = randn(6, 2)
    x = R.t(x0)
    first, unused, last = R.split(x, 3, axis=0)
    loss = total(first * first + first * last * 3.0)
    got = evaluate(R.grad(loss, x))
    leaf = x0.clone().requires_grad_()
    a, _, c = torch.split(leaf, 2)
    (want,) = torch.autograd.grad((a * a + a * c * 3).sum(), leaf)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_integer_values_carry_no_gradient():
    x0 = randn(7)
    x = R.t(x0)
    loss = total(x * (x > 0.0))
    torch.testing.assert_close(evaluate(R.grad(loss, x)), (x0 > 0).to(DT))


def test_grad_output_for_a_non_scalar_loss():
    x0, g0 = randn(2, 3), randn(2, 3, seed=1)
    x = R.t(x0)
    got = evaluate(R.grad(R.tanh(x), x, grad_output=g0))
    torch.testing.assert_close(got, g0 * (1 - torch.tanh(x0) ** 2), rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="not a scalar"):
        R.grad(R.tanh(x), x)
    with pytest.raises(ValueError, match="grad_output has shape"):
        R.grad(R.tanh(x), x, grad_output=randn(3))


def test_non_differentiable_op_on_the_path_is_named_with_its_line():
    p = R.t(randn(3))
    zeros = R.t(torch.zeros(3, dtype=DT))
    line = inspect.currentframe().f_lineno + 1
    stepped = R.adam_step(p, p * 2.0, zeros, zeros, zeros, step=1)[0]
    with pytest.raises(R.NotDifferentiableError) as error:
        R.grad(total(stepped), p)
    assert "'adam_step'" in str(error.value) and f"test_autodiff.py:{line}" in str(error.value)


def test_chain_rule_through_a_small_cnn_matches_torch():
    x0, labels = randn(4, 2, 6, 6), torch.tensor([[[1]], [[0]], [[2]], [[1]]])
    w1, b1 = randn(3, 2, 3, 3, seed=1) * 0.5, randn(3, seed=2)
    gamma, beta = randn(3, seed=3), randn(3, seed=4)
    w2, b2 = randn(3, 3, 3, 3, seed=5) * 0.5, randn(3, seed=6)
    mean0, var0 = torch.zeros(3, dtype=DT), torch.ones(3, dtype=DT)
    params = [w1, b1, gamma, beta, w2, b2]

    ops = [R.t(p) for p in params]
    h = R.conv2d(R.t(x0), ops[0], ops[1], padding="same", padding_mode="reflect")
    h, _, _ = R.batch_norm(h, R.t(mean0), R.t(var0), ops[2], ops[3])
    h = R.max_pool2d(R.elu(h), 2)
    logits = R.conv2d(h, ops[4], ops[5])                                   # (4, 3, 1, 1)
    loss = R.cross_entropy_loss(R.t(labels), logits)
    got = evaluate(R.grad(loss, ops))

    leaves = [p.clone().requires_grad_() for p in params]
    h = TF.conv2d(TF.pad(x0, (1, 1, 1, 1), mode="reflect"), leaves[0], leaves[1])
    h = TF.batch_norm(h, mean0.clone(), var0.clone(), leaves[2], leaves[3], training=True)
    h = TF.max_pool2d(TF.elu(h), 2)
    want = torch.autograd.grad(TF.cross_entropy(TF.conv2d(h, leaves[4], leaves[5]), labels), leaves)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_chain_rule_through_a_small_transformer_block_matches_torch():
    tokens = torch.tensor([[1, 4, 2, 0], [3, 3, 1, 4]])
    targets = torch.tensor([[4, 2, 0, -1], [3, 1, 4, -1]])
    emb, ln_w, ln_b = randn(5, 8), randn(8, seed=1), randn(8, seed=2)
    w1, b1, w2 = randn(16, 8, seed=3) * 0.3, randn(16, seed=4), randn(5, 8, seed=5) * 0.3
    params = [emb, ln_w, ln_b, w1, b1, w2]

    ops = [R.t(p) for p in params]
    h = R.embedding(R.t(tokens), ops[0])
    h = R.layer_norm(h, ops[1], ops[2], normalized_shape=8)
    h = h + R.gelu(R.linear(h, ops[3], ops[4])).linear(R.t(torch.eye(8, 16, dtype=DT)))
    logits = R.linear(R.dropout(h, p=0.25), ops[5])
    loss = R.cross_entropy_loss(R.t(targets), logits, ignore_index=-1, reshape_target=(-1, 5), reshape_label=(-1,))
    dropout_node = logits.inputs[0]
    got = evaluate(R.grad(loss, ops))

    leaves = [p.clone().requires_grad_() for p in params]
    h = TF.embedding(tokens, leaves[0])
    h = TF.layer_norm(h, (8,), leaves[1], leaves[2])
    h = h + TF.linear(TF.gelu(TF.linear(h, leaves[3], leaves[4])), torch.eye(8, 16, dtype=DT))
    h = run_op(registry.get("dropout"), [h], dropout_node.params, dropout_node.graph.seed, dropout_node.id)
    logits = TF.linear(h, leaves[5])
    want = torch.autograd.grad(TF.cross_entropy(logits.view(-1, 5), targets.view(-1), ignore_index=-1), leaves)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_dropout_gradient_reuses_the_forward_mask():
    x = R.t(torch.ones(200, 50, dtype=DT))
    y = R.dropout(x, p=0.3)
    g = R.grad(total(y), x)
    y0, g0 = evaluate([y, g])
    assert torch.equal(y0, g0)                  # d(sum y)/dx is the scaled mask itself, element for element
    assert 0.27 < (y0 == 0).double().mean().item() < 0.33
    assert torch.allclose(y0[y0 != 0], torch.tensor(1 / 0.7, dtype=DT))


def test_errors_for_bad_arguments():
    x = R.t(randn(3))
    with pytest.raises(TypeError, match="wrt must be an Op"):
        R.grad(total(x), [x, 3])
    with pytest.raises(TypeError, match="floating-point"):
        R.grad(R.t(torch.tensor(3)), x)
    with pytest.raises(TypeError, match="integers carry no gradient"):
        R.grad(total(x), R.t(torch.tensor([1, 2])))
    assert R.grad(total(x), []) == [] and R.grad(total(x), ()) == ()
