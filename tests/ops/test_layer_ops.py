"""Record-time behaviour of the layer-level ops: shape rules agree with torch over a grid of settings, and
bad arguments fail when recorded, with a message that says what is wrong."""
import itertools

import pytest
import torch
import torch.nn.functional as TF

import ravop as R


@pytest.fixture(autouse=True)
def graph():
    return R.Graph(name="layer-ops")


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def op(*shape, dtype=torch.float32):
    return R.t(torch.zeros(*shape, dtype=dtype))


CONV_SETTINGS = list(itertools.product(
    [(9, 9), (8, 11)],                          # input H, W
    [(3, 3), (2, 4)],                           # kernel
    [1, 2, (2, 1)],                             # stride
    [0, 1, (2, 1), "same", "valid"],            # padding
    [1, 2],                                     # dilation
    ["zeros", "reflect", "replicate", "circular"]))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")   # torch's note on its own copy
def test_conv2d_shape_rule_matches_torch():
    checked = 0
    for hw, k, stride, padding, dilation, mode in CONV_SETTINGS:
        if padding == "same" and stride != 1:   # torch refuses this combination too
            with pytest.raises(R.ShapeError, match="stride=1"):
                R.conv2d(op(1, 2, *hw), op(4, 2, *k), stride=stride, padding=padding)
            continue
        module = torch.nn.Conv2d(2, 4, k, stride, padding, dilation, padding_mode=mode, device="meta")
        try:
            want = tuple(module(meta(1, 2, *hw)).shape)
        except RuntimeError:   # the kernel does not fit: the rule must refuse it too
            with pytest.raises(R.ShapeError):
                R.conv2d(op(1, 2, *hw), op(4, 2, *k), stride=stride, padding=padding, dilation=dilation,
                         padding_mode=mode)
            continue
        got = R.conv2d(op(1, 2, *hw), op(4, 2, *k), op(4), stride=stride, padding=padding, dilation=dilation,
                       padding_mode=mode)
        assert got.shape == want, (hw, k, stride, padding, dilation, mode)
        checked += 1
    assert checked > 300


def test_max_pool2d_shape_rule_matches_torch():
    checked = 0
    for size, k, stride, padding, dilation, ceil in itertools.product(
            [5, 8, 9], [2, 3], [None, 1, 2, 3], [0, 1], [1, 2], [False, True]):
        try:
            want = tuple(TF.max_pool2d(meta(1, 1, size, size + 1), k, stride, padding, dilation, ceil).shape)
        except RuntimeError:
            with pytest.raises(R.ShapeError):
                R.max_pool2d(op(1, 1, size, size + 1), k, stride, padding, dilation, ceil)
            continue
        got = R.max_pool2d(op(1, 1, size, size + 1), k, stride, padding, dilation, ceil)
        assert got.shape == want, (size, k, stride, padding, dilation, ceil)
        checked += 1
    assert checked > 150


@pytest.mark.parametrize("record, message", [
    (lambda: R.linear(op(2, 3), op(4, 3, dtype=torch.float64)), "one dtype"),
    (lambda: R.linear(op(2, 3), op(4, 5)), "in_features=5"),
    (lambda: R.linear(op(2, 3), op(4, 3), op(3)), r"bias must have shape \(4,\)"),
    (lambda: R.conv2d(op(1, 3, 5, 5), op(4, 2, 3, 3)), "channels"),
    (lambda: R.conv2d(op(3, 5, 5), op(4, 3, 3, 3)), "4-d input"),
    (lambda: R.conv2d(op(1, 3, 5, 5), op(4, 3, 3, 3), padding_mode="mirror"), "padding_mode"),
    (lambda: R.max_pool2d(op(1, 1, 4, 4), 2, padding=2), "at most half"),
    (lambda: R.batch_norm(op(4, 3), op(3), op(3), op(3)), "weight and bias together"),
    (lambda: R.batch_norm(op(1, 3), op(3), op(3)), "more than 1 value per channel"),
    (lambda: R.batch_norm(op(4, 3), op(2), op(3)), r"running_mean must have shape \(3,\)"),
    (lambda: R.layer_norm(op(2, 3), normalized_shape=4), "tail of the input's shape"),
    (lambda: R.embedding(op(3), op(5, 2)), "indices must be int64"),
    (lambda: R.dropout(op(3), p=1.5), r"in \[0, 1\]"),
    (lambda: R.elu(op(3, dtype=torch.int64)), "floating-point input"),
    (lambda: R.softmax(op(3, 4), axis=2), "out of range"),
    (lambda: R.square_loss(op(4), op(4, 1)), "same shape"),
    (lambda: R.cross_entropy_loss(op(4, dtype=torch.int64), op(4, 3, 2)), r"must have shape \(4, 2\)"),
    (lambda: R.cross_entropy_loss(op(4, 3), op(4, 3), ignore_index=0), "ignore_index"),
    (lambda: R.cross_entropy_loss(op(6, dtype=torch.int64), op(2, 9), reshape_target=(-1, 4)), "cannot reshape"),
    (lambda: R.adam_step(*[op(3)] * 5, step=0), "positive int"),
    (lambda: R.adam_step(*[op(3)] * 4, op(2), step=1), "state 2 has shape"),
    (lambda: R.rmsprop_step(*[op(3)] * 5, lr=-1.0), "invalid RMSprop"),
])
def test_bad_arguments_fail_when_recorded(record, message):
    with pytest.raises(R.ShapeError, match=message):
        record()
