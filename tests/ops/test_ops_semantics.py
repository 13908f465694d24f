"""numpy-like semantics the sample walk does not show: record-time errors, dtype rules, unknown dims,
operator forms, and the original API's call styles."""
import numpy as np
import pytest
import torch

import ravop as R
from ravop.core.errors import ShapeError
from ravop.ops import rules
from ravop.runtime.evaluate import evaluate

A = np.arange(12.0).reshape(3, 4)


@pytest.fixture(autouse=True)
def graph():
    return R.Graph(name="semantics")


@pytest.mark.parametrize("record, message", [
    (lambda: R.matmul(R.t(A), R.t(A)), r"inner dimensions differ \(4 vs 3\)"),
    (lambda: R.dot(R.t(A), R.t(np.ones(3))), "differ"),
    (lambda: R.reshape(R.t(A), shape=(5, -1)), "cannot reshape 12 elements"),
    (lambda: R.reshape(R.t(A), shape=(-1, -1)), "only infer one"),
    (lambda: R.sum(R.t(A), axis=2), "axis 2 is out of range"),
    (lambda: R.mean(R.t(A), axis=(0, -2)), "repeated axis"),
    (lambda: R.squeeze(R.t(A), axis=0), "cannot squeeze axis 0 of size 3"),
    (lambda: R.concat([R.t(A), R.t(np.ones((3, 5)))]), "differ off that axis"),
    (lambda: R.stack([R.t(A), R.t(A.T)]), "one shape"),
    (lambda: R.transpose(R.t(A), axes=(0, 0)), "not a permutation"),
    (lambda: R.max(R.t(np.zeros((0, 3))), axis=0), "zero-size"),
    (lambda: R.split(R.t(A), 5, axis=1), "equal parts"),
    (lambda: R.inv(R.t(A)), "square matrices"),
    (lambda: R.percentile(R.t(A), 120), r"\[0, 100\]"),
    (lambda: R.pad(R.t(A), sequence=1, mode="mirror"), "pad mode 'mirror'"),
    (lambda: R.t(A) + R.t(np.ones(3)), "cannot broadcast"),
])
def test_shape_errors_raise_when_recorded(record, message):
    with pytest.raises(ShapeError, match=message):
        record()


def test_shape_error_names_op_shapes_and_the_user_line():
    x, y = R.t(A), R.t(np.ones((3, 2)))
    with pytest.raises(ShapeError) as info:
        R.matmul(x, y)
    text = str(info.value)
    line = test_shape_error_names_op_shapes_and_the_user_line.__code__.co_firstlineno + 3
    assert text.startswith("matmul:") and "(3, 4), (3, 2)" in text and f"{__file__}:{line}" in text


def test_every_recorded_op_names_the_users_line_and_python_numbers_share_one_constant():
    """Recording's shortcuts (one source string per line, Python numbers straight to the graph's shared
    constant, an input's Shape shared by the result) keep what each op must say."""
    x = R.t(torch.arange(12.0).reshape(3, 4))
    first = test_every_recorded_op_names_the_users_line_and_python_numbers_share_one_constant.__code__.co_firstlineno
    ops = []
    for _ in range(3):
        ops += [x * 0.5, R.exp(x), x.abs(), 2 - x]   # one line: every op of it names it
    assert {op.source for op in ops} == {f"{__file__}:{first + 7}"}
    assert len({op.inputs[1] for op in ops[0::4]}) == 1 and ops[0].inputs[1].shape == ()   # x * 0.5: one constant
    assert ops[3].inputs[0].dtype == torch.int64 and ops[3].dtype == torch.float32        # 2 - x promotes
    assert ops[0].shape == (3, 4) and ops[0].dtype == torch.float32
    assert (x + R.t(np.ones(4))).shape == (3, 4) and (x + R.t(np.ones(4))).dtype == torch.float64
    assert (x + x).dtype == torch.float32 and (R.t([True]) + R.t([False])).dtype == torch.bool
    assert (R.t(np.ones((3, 1))) * x).shape == (3, 4)


def test_ops_recorded_at_a_scripts_top_level_name_their_own_lines():
    """A recording site's line is worked out once per code object and instruction: lines of one code object
    (a script's top level) stay apart, and the same site in a new code object (a notebook cell run again, with
    other lines above it) gets its own line."""
    x = R.t([1.0, 2.0])
    for filler in (500, 20, 500):
        script = "\n".join(f"v{i} = {i}" for i in range(1, filler)) + "\na = x * 2.0\nb = x + 1.0; c = R.exp(x)\n"
        names = {"x": x, "R": R}
        exec(compile(script, "script.py", "exec"), names)   # this test's own code
        assert names["a"].source == f"script.py:{filler}"
        assert names["b"].source == names["c"].source == f"script.py:{filler + 1}"


def test_result_dtypes_follow_numpy_and_torch():
    ints = R.t(np.arange(6).reshape(2, 3))
    assert R.mean(ints).dtype == torch.float32
    assert R.variance(ints, axis=0).dtype == torch.float32
    assert R.median(ints).dtype == torch.float32
    assert R.sum(ints > 2).dtype == torch.int64
    assert R.argmax(R.t(A), axis=1).dtype == torch.int64
    assert (ints < 3).dtype == torch.bool and R.logical_xor(ints, ints).dtype == torch.bool
    assert R.max(ints).dtype == ints.dtype
    assert R.matmul(R.t(A, dtype="float32"), R.t(A.T)).dtype == torch.float64
    np.testing.assert_allclose(evaluate(R.mean(ints, axis=0)).numpy(), [1.5, 2.5, 3.5])


def test_axis_empty_tuple_reduces_nothing():
    # torch's dim=() would reduce every dim; numpy's axis=() reduces none
    out = R.sum(R.t(A), axis=())
    assert out.shape == (3, 4)
    np.testing.assert_array_equal(evaluate(out).numpy(), A)


def test_operators_and_methods():
    x = R.t(A)
    square = R.t(np.array([[2.0, 1.0], [1.0, 3.0]]))
    results = evaluate([x @ x.transpose(), ~square, x > 5.0, x == 3.0, x.sum(axis=0, keepdims=True),
                        x.reshape(shape=(4, 3)).max(axis=-1), x.expand_dims(axis=1).squeeze(axis=1)])
    np.testing.assert_allclose(results[0].numpy(), A @ A.T)
    np.testing.assert_allclose(results[1].numpy(), np.linalg.inv([[2.0, 1.0], [1.0, 3.0]]))
    np.testing.assert_array_equal(results[2].numpy(), A > 5)
    np.testing.assert_array_equal(results[3].numpy(), A == 3)
    np.testing.assert_array_equal(results[4].numpy(), A.sum(axis=0, keepdims=True))
    np.testing.assert_array_equal(results[5].numpy(), A.reshape(4, 3).max(axis=-1))
    np.testing.assert_array_equal(results[6].numpy(), A)
    assert len({x, x}) == 1  # == records an op, yet Ops stay hashable by identity


def test_where_takes_numpy_order_and_the_original_keyword_form():
    x, y = R.t(A), R.t(-A)
    condition = x > 4.0
    numpy_style, original_style = evaluate([R.where(condition, x, y), R.where(x, y, condition=condition)])
    np.testing.assert_array_equal(numpy_style.numpy(), np.where(A > 4, A, -A))
    np.testing.assert_array_equal(original_style.numpy(), np.where(A > 4, A, -A))
    with pytest.raises(TypeError, match="condition"):
        R.where(x, y)


def test_unknown_dimensions_broadcast_and_flow_through():
    assert rules.broadcast((-1,), (1,)) == (-1,)
    assert rules.broadcast((-1, 1), (1, 5)) == (-1, 5)
    assert rules.broadcast((-1,), (4,)) == (4,)
    assert rules.broadcast((1,), (-1,)) == (-1,)
    with pytest.raises(ValueError):
        rules.broadcast((2,), (3,))
    values = R.unique(R.t(np.array([3, 1, 3, 7])))
    counted = R.bincount(values, minlength=2)
    assert values.shape == (-1,) and counted.shape == (-1,)
    np.testing.assert_array_equal(evaluate(R.expand_dims(values, axis=0) * 2).numpy(), [[2, 6, 14]])
    np.testing.assert_array_equal(evaluate(counted).numpy(), np.bincount([1, 3, 7]))


def test_original_ops_without_worker_implementations_now_run():
    """slice, cube, median, sign and random had no worker kernel in the original Ravop."""
    x = R.t(np.array([[-2.0, 0.0, 3.0], [1.0, 5.0, -4.0]]))
    got = evaluate([R.slice(x, begin=1, size=1), R.cube(x), R.median(x), R.sign(x), R.random(size=2)])
    np.testing.assert_array_equal(got[0].numpy(), [[1.0, 5.0, -4.0]])
    np.testing.assert_array_equal(got[1].numpy(), evaluate(x).numpy() ** 3)
    assert got[2].item() == 0.5
    np.testing.assert_array_equal(got[3].numpy(), [[-1, 0, 1], [1, 1, -1]])
    assert got[4].shape == (2,)


def test_sign_and_comparisons_carry_no_gradient():
    x = R.t(np.array([1.5, -2.0]))
    loss = R.sum(R.sign(x) * x)  # d/dx = sign(x): the sign op itself contributes nothing
    np.testing.assert_array_equal(evaluate(R.grad(loss, x)).numpy(), [1.0, -1.0])


def test_variadic_ops_take_tensors_one_by_one_as_the_original():
    a, b = R.t(A), R.t(-A)
    one_by_one = [a.concat(b), R.concat(a, b, 1), R.stack(a, b, axis=-1), a.join_to_list(b)]
    as_list = [R.concat([a, b]), R.concat([a, b], axis=1), R.stack([a, b], axis=-1)]
    got = evaluate(one_by_one + as_list)
    np.testing.assert_array_equal(got[0].numpy(), np.concatenate([A, -A]))
    np.testing.assert_array_equal(got[1].numpy(), np.concatenate([A, -A], axis=1))
    np.testing.assert_array_equal(got[2].numpy(), np.stack([A, -A], axis=-1))
    np.testing.assert_array_equal(got[3].numpy(), np.append(A, -A))
    for single, listed in zip(got[:3], got[4:]):
        np.testing.assert_array_equal(single.numpy(), listed.numpy())
