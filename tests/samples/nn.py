"""Samples for the layer-level ops (ravop/ops/nn.py) and their backward ops.

References are torch.nn modules and torch.nn.functional (forward ops) and torch.autograd through them
(backward ops), so each check is independent of the op's own kernel."""
import warnings

import torch
import torch.nn.functional as TF

from . import Sample

_gen = torch.Generator().manual_seed(1234)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen, dtype=dtype)


def rand(*shape, dtype=torch.float32):
    return torch.rand(*shape, generator=_gen, dtype=dtype)


def autograd_grads(forward, inputs, g, wrt, mask=None):
    """torch.autograd's gradients of `forward(*inputs)` (its first output) w.r.t. the inputs at positions
    `wrt`, zeros where unused, keeping those `mask` asks for: the reference for a backward op."""
    leaves = [t.detach().clone().requires_grad_(i in wrt) for i, t in enumerate(inputs)]
    with torch.enable_grad():
        out = forward(*leaves)
        out = out[0] if isinstance(out, tuple) else out
        grads = torch.autograd.grad(out, [leaves[i] for i in wrt], g, allow_unused=True)
    grads = [torch.zeros_like(leaves[i]) if gr is None else gr for i, gr in zip(wrt, grads)]
    return tuple(gr for gr, wanted in zip(grads, mask or (True,) * len(grads)) if wanted)


# ---------------------------------------------------------------------------------------------- linear

def _linear_backward_ref(g, x, w, mask=(True, True, True)):
    b = torch.zeros(w.shape[0], dtype=w.dtype)
    return autograd_grads(TF.linear, (x, w, b), g, (0, 1, 2), mask)


# ---------------------------------------------------------------------------------------------- conv2d

def conv_module(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    """nn.Conv2d holding `w` and `b`, applied to x: an independent account of padding modes and 'same'."""
    module = torch.nn.Conv2d(x.shape[1], w.shape[0], tuple(w.shape[2:]), stride, padding, dilation, groups,
                             b is not None, padding_mode, dtype=w.dtype)
    tensors = {"weight": w} if b is None else {"weight": w, "bias": b}
    with warnings.catch_warnings():   # torch warns that 'same' with an even kernel copies the input: known
        warnings.simplefilter("ignore", UserWarning)
        return torch.func.functional_call(module, tensors, (x,))   # keeps w and b in autograd's graph


def _conv_ref(*args, **params):
    with torch.no_grad():
        return conv_module(*args, **params)


def _conv_backward_ref(g, x, w, mask=(True, True, True), **params):
    b = torch.zeros(w.shape[0], dtype=w.dtype)
    return autograd_grads(lambda x, w, b: conv_module(x, w, b, **params), (x, w, b), g, (0, 1, 2), mask)


def _conv(x_shape, w_shape, bias=True, note="", grad=True, **params):
    inputs = (randn(*x_shape), randn(*w_shape)) + ((randn(w_shape[0]),) if bias else ())
    return Sample(inputs, params, reference=_conv_ref, grad=grad, note=note)


CONV2D = [
    _conv((2, 3, 8, 8), (4, 3, 3, 3), note="bias, defaults"),
    _conv((1, 3, 9, 7), (2, 3, 3, 2), bias=False, stride=2, padding=1, dilation=2, note="stride/pad/dilation"),
    _conv((1, 4, 7, 7), (6, 2, 3, 3), groups=2, padding=(1, 0), stride=(1, 2), note="groups, pairs"),
    _conv((2, 2, 6, 6), (3, 2, 3, 3), padding="same", note="'same', odd kernel"),
    _conv((2, 2, 6, 5), (3, 2, 4, 2), padding="same", dilation=(1, 3), note="'same', even kernel: asymmetric"),
    _conv((1, 2, 6, 6), (3, 2, 3, 3), padding="valid", note="'valid'"),
    _conv((2, 2, 6, 6), (3, 2, 3, 3), padding=(1, 2), padding_mode="reflect", note="reflect"),
    _conv((2, 2, 6, 6), (3, 2, 3, 3), padding=2, padding_mode="replicate", note="replicate"),
    _conv((2, 2, 5, 6), (3, 2, 3, 3), padding=(2, 1), padding_mode="circular", note="circular"),
    _conv((1, 2, 6, 6), (3, 2, 4, 4), padding="same", padding_mode="reflect", note="'same' + reflect"),
    _conv((1, 2, 6, 6), (3, 2, 2, 3), padding="same", padding_mode="circular", note="'same' + circular"),
    _conv((0, 2, 5, 5), (3, 2, 3, 3), note="empty batch", grad=False),
]


def _conv_backward(x_shape, w_shape, mask=(True, True, True), **params):
    g_shape = conv_module(randn(*x_shape), randn(*w_shape), **params).shape
    return Sample((randn(*g_shape), randn(*x_shape), randn(*w_shape)), {**params, "mask": mask},
                  reference=_conv_backward_ref)


CONV2D_BACKWARD = [
    _conv_backward((2, 3, 6, 6), (4, 3, 3, 3)),
    _conv_backward((1, 4, 7, 7), (6, 2, 3, 3), mask=(False, True, False), groups=2, stride=2, dilation=2),
    _conv_backward((2, 2, 6, 6), (3, 2, 4, 4), mask=(True, False, True), padding="same", padding_mode="reflect"),
    _conv_backward((2, 2, 6, 6), (3, 2, 4, 3), padding="same"),
    _conv_backward((2, 2, 5, 6), (3, 2, 3, 3), mask=(True, False, False), padding=2, padding_mode="circular"),
    _conv_backward((2, 2, 5, 6), (3, 2, 3, 3), padding=(1, 2), padding_mode="replicate"),
]


# ---------------------------------------------------------------------------------------------- max_pool2d

def _pool_ref(x, **params):
    return TF.max_pool2d(x, **params)


def _pool_backward_ref(g, x, **params):
    return autograd_grads(lambda x: TF.max_pool2d(x, **params), (x,), g, (0,))[0]


MAX_POOL2D = [
    Sample((randn(2, 3, 8, 8),), {"kernel_size": 2}, reference=_pool_ref, note="defaults: stride = kernel"),
    Sample((randn(1, 2, 9, 9),), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
           reference=_pool_ref, note="ceil_mode and padding"),
    Sample((randn(1, 2, 9, 8),), {"kernel_size": (2, 3), "stride": (1, 2), "dilation": 2}, reference=_pool_ref,
           note="pairs, dilation"),
    Sample((randn(3, 7, 7),), {"kernel_size": 2, "return_indices": True}, reference=_pool_ref,
           note="unbatched, two outputs"),
    Sample((torch.tensor([[[[1.0, 1.0], [0.0, 1.0]]]]),), {"kernel_size": 2}, reference=_pool_ref,
           note="ties pick the first maximum"),
]
MAX_POOL2D_BACKWARD = [
    Sample((randn(2, 3, 4, 4), randn(2, 3, 8, 8)), {"kernel_size": 2}, reference=_pool_backward_ref),
    Sample((randn(1, 2, 5, 5), randn(1, 2, 9, 9)), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
           reference=_pool_backward_ref, note="overlapping windows add up"),
]




def _indices_sample(g_shape, x_shape, **params):
    x = randn(*x_shape)
    _, indices = TF.max_pool2d(x, return_indices=True, **params)
    return Sample((randn(*g_shape), x, indices), params,
                  reference=lambda g, x, indices, **p: _pool_backward_ref(g, x, **p))


MAX_POOL2D_INDICES_BACKWARD = [
    _indices_sample((2, 3, 4, 4), (2, 3, 8, 8), kernel_size=2),
    _indices_sample((1, 2, 5, 5), (1, 2, 9, 9), kernel_size=3, stride=2, padding=1, ceil_mode=True),
]


# ---------------------------------------------------------------------------------------------- batch_norm

def _bn_ref(x, running_mean, running_var, weight=None, bias=None, training=True, momentum=0.1, eps=1e-5):
    mean, var = running_mean.clone(), running_var.clone()
    return TF.batch_norm(x, mean, var, weight, bias, training, momentum, eps), mean, var


def _bn_backward_ref(g, x, running_mean, running_var, weight=None, training=True, eps=1e-5, mask=None):
    inputs = (x, running_mean, running_var) + ((weight, torch.zeros_like(weight)) if weight is not None else ())
    return autograd_grads(lambda x, m, v, *wb: _bn_ref(x, m, v, *wb, training=training, eps=eps)[0],
                          inputs, g, (0, 3, 4) if weight is not None else (0,), mask)


def _stats(c):
    return randn(c), rand(c) + 0.5


def _bn(x_shape, affine=True, note="", **params):
    c = x_shape[1]
    inputs = (randn(*x_shape) * 2 + 1,) + _stats(c) + ((randn(c), randn(c)) if affine else ())
    return Sample(inputs, params, reference=_bn_ref, note=note)


BATCH_NORM = [
    _bn((6, 3), note="2-d, training"),
    _bn((4, 3, 5), affine=False, note="3-d, no affine"),
    _bn((2, 3, 4, 4), momentum=0.99, eps=0.01, note="4-d, RavDL's momentum and epsilon"),
    _bn((2, 3, 4, 4), training=False, note="eval: running statistics, passed through"),
    _bn((5, 2), affine=False, training=False, note="2-d eval, no affine"),
]


def _bn_backward(x_shape, affine=True, mask=(True, True, True), **params):
    c = x_shape[1]
    inputs = (randn(*x_shape), randn(*x_shape) * 2 + 1) + _stats(c) + ((randn(c),) if affine else ())
    return Sample(inputs, {**params, "mask": mask if affine else (True, False, False)}, reference=_bn_backward_ref)


BATCH_NORM_BACKWARD = [
    _bn_backward((6, 3)),
    _bn_backward((2, 3, 4, 4), mask=(False, True, True)),
    _bn_backward((4, 3, 5), affine=False),
    _bn_backward((2, 3, 4, 4), training=False),
]


# ---------------------------------------------------------------------------------------------- layer_norm

def _ln_ref(x, weight=None, bias=None, normalized_shape=None, eps=1e-5):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    return TF.layer_norm(x, shape, weight, bias, eps)


def _ln_backward_ref(g, x, weight=None, bias=None, normalized_shape=None, eps=1e-5, mask=None):
    inputs = (x,) + ((weight, bias) if weight is not None else ())
    return autograd_grads(lambda *a: _ln_ref(*a, normalized_shape=normalized_shape, eps=eps), inputs, g,
                          tuple(range(len(inputs))), mask)


LAYER_NORM = [
    Sample((randn(4, 5), randn(5), randn(5)), {"normalized_shape": 5}, reference=_ln_ref, note="affine"),
    Sample((randn(2, 3, 4) * 3,), {"normalized_shape": (3, 4), "eps": 1e-3}, reference=_ln_ref,
           note="two normalised dims, no affine"),
]
LAYER_NORM_BACKWARD = [
    Sample((randn(4, 5), randn(4, 5), randn(5), randn(5)), {"normalized_shape": 5}, reference=_ln_backward_ref),
    Sample((randn(2, 3, 4), randn(2, 3, 4)), {"normalized_shape": (3, 4), "mask": (True, False, False)},
           reference=_ln_backward_ref),
    Sample((randn(4, 5), randn(4, 5), randn(5), randn(5)), {"normalized_shape": 5, "mask": (False, True, True)},
           reference=_ln_backward_ref),
]


# ---------------------------------------------------------------------------------------------- embedding

def _embedding_backward_ref(g, indices, num_weights):
    weight = torch.zeros(num_weights, g.shape[-1], dtype=g.dtype)
    return autograd_grads(TF.embedding, (indices, weight), g, (1,))[0]


EMBEDDING = [
    Sample((torch.tensor([[0, 2, 4], [2, 2, 1]]), randn(5, 4)), reference=TF.embedding,
           note="repeated indices: their gradients add up"),
    Sample((torch.tensor(3), randn(5, 4)), reference=TF.embedding, note="0-d index"),
    Sample((torch.zeros(0, 3, dtype=torch.int64), randn(5, 4)), reference=TF.embedding, note="no indices"),
]
EMBEDDING_BACKWARD = [
    Sample((randn(2, 3, 4), torch.tensor([[0, 2, 4], [2, 2, 1]])), {"num_weights": 6},
           reference=_embedding_backward_ref),
]


# ---------------------------------------------------------------------------------------------- dropout

DROPOUT = [
    Sample((randn(4, 6),), {"p": 0.5}, note="training: a seeded mask, the same in the gradient"),
    Sample((randn(3, 5, dtype=torch.float64),), {"p": 0.2}, note="float64"),
    Sample((randn(4, 6),), {"p": 0.5, "training": False}, reference=lambda x, **_: x, note="eval: identity"),
    Sample((randn(4, 6),), {"p": 0.0}, reference=lambda x, **_: x, note="p=0: identity"),
    Sample((randn(4, 6),), {"p": 1.0}, reference=lambda x, **_: torch.zeros_like(x), note="p=1: all dropped"),
    Sample((randn(0, 6),), {"p": 0.5}, note="empty"),
]
DROPOUT_BACKWARD = [
    Sample((randn(4, 6),), {"p": 0.3, "seed": 12345}),
    Sample((randn(4, 6),), {"p": 1.0, "seed": 1}, reference=lambda g, **_: torch.zeros_like(g)),
]


SAMPLES = {
    "linear": [
        Sample((randn(4, 3), randn(5, 3), randn(5)), reference=TF.linear, note="2-d input with bias"),
        Sample((randn(2, 4, 3), randn(5, 3)), reference=TF.linear, note="3-d input, no bias"),
        Sample((randn(3), randn(2, 3), randn(2)), reference=TF.linear, note="1-d input"),
        Sample((randn(0, 3), randn(2, 3), randn(2)), reference=TF.linear, note="empty batch"),
    ],
    "linear_backward": [
        Sample((randn(4, 5), randn(4, 3), randn(5, 3)), reference=_linear_backward_ref),
        Sample((randn(2, 4, 5), randn(2, 4, 3), randn(5, 3)), {"mask": (False, True, True)},
               reference=_linear_backward_ref, note="3-d, no input gradient"),
        Sample((randn(0, 5), randn(0, 3), randn(5, 3)), {"mask": (True, True, False)},
               reference=_linear_backward_ref, note="empty batch: zero weight gradient"),
    ],
    "conv2d": CONV2D,
    "conv2d_backward": CONV2D_BACKWARD,
    "max_pool2d": MAX_POOL2D,
    "max_pool2d_backward": MAX_POOL2D_BACKWARD,
    "max_pool2d_indices_backward": MAX_POOL2D_INDICES_BACKWARD,
    "batch_norm": BATCH_NORM,
    "batch_norm_backward": BATCH_NORM_BACKWARD,
    "layer_norm": LAYER_NORM,
    "layer_norm_backward": LAYER_NORM_BACKWARD,
    "embedding": EMBEDDING,
    "embedding_backward": EMBEDDING_BACKWARD,
    "dropout": DROPOUT,
    "dropout_backward": DROPOUT_BACKWARD,
}
