"""Layer-level ops: linear, conv2d, max_pool2d, batch_norm, layer_norm, embedding, dropout.

Each is one op (a training step stays tens of ops, not hundreds), and each has a `<name>_backward` op whose
kernel calls the aten backward kernel eager autograd calls (`convolution_backward`,
`native_batch_norm_backward`, ...), so gradients equal eager PyTorch's. A backward op takes a `mask` param,
one bool per differentiable input, and has one output per True entry: a VJP asks only for the gradients
the running `R.grad` wants (no gradient of a first layer w.r.t. the data batch; ravop/ops/masked.py).

Statistics the forward computes and the backward needs again (batch-norm mean/invstd, layer-norm
mean/rstd) are recomputed by the backward kernel from the same input rather than carried as extra outputs:
they are cheap next to the op, and the forward keeps the outputs users see. Pooling's argmax is not cheap
(finding it is the whole forward, ~7x the backward kernel), so when the forward returned its indices
(RavDL's MaxPooling2D asks for them when training) the backward routes the gradient through them.
"""
import functools

import torch
import torch.nn.functional as F

from ..core import op_functions as R
from ..core.dtypes import is_floating
from ..core.registry import REQUIRED, Reuses, Variant, register
from ..core.sizes import numel
from ..runtime.runner import op_seed
from . import flops, scriptable
from .masked import backward_mask, call_backward, keep_masked, masked_shapes
from .rules import Like

aten = torch.ops.aten


def _pair(v):
    return (v, v) if type(v) is int else tuple(v)


def _same_dtype(x, w, b):
    """torch's matmul and convolution kernels take one dtype: say so at record time, not on a worker."""
    if x.dtype is not w.dtype or (b is not None and b.dtype is not w.dtype):
        raise TypeError(f"input, weight and bias must have one dtype, got {x.dtype}, {w.dtype}"
                        f"{'' if b is None else ', ' + str(b.dtype)}: cast them (e.g. R.t(array, dtype='float32'))")
    return x.dtype


def _check_vector(name, v, n):
    if v is not None and tuple(v.shape) != (n,):
        raise ValueError(f"{name} must have shape ({n},), not {tuple(v.shape)}")


# ---------------------------------------------------------------------------------------------- linear

def _linear_shape(x, w, b=None):
    if len(w.shape) != 2:
        raise ValueError(f"weight must be 2-d (out_features, in_features), not {w.shape}")
    if not x.shape or x.shape[-1] not in (w.shape[1], -1):   # -1: a data-dependent size
        raise ValueError(f"input's last dimension must be in_features={w.shape[1]}, input is {x.shape}")
    _check_vector("bias", b, w.shape[0])
    return x.shape[:-1] + (w.shape[0],), _same_dtype(x, w, b)


def _linear_vjp(node, g, wants):
    mask = backward_mask(wants, *node.inputs) + ((False,) if len(node.inputs) == 2 else ())
    x, w = node.inputs[:2]
    return call_backward(R.linear_backward, mask, g, x, w)[:len(node.inputs)]


@register("linear", inputs=("x", "w", "b?"), shape=_linear_shape, vjp=_linear_vjp, flops=flops.linear)
def linear(x, w, b=None):
    """x @ w.T + b, with w in torch's (out_features, in_features) layout."""
    return F.linear(x, w, b)


def _linear_backward_shape(g, x, w, mask):
    return masked_shapes(mask, x, w, Like((w.shape[0],), g.dtype))


@register("linear_backward", inputs=("g", "x", "w"), params={"mask": (True, True, True)},
          shape=_linear_backward_shape, method=False, flops=flops.linear_backward)
def linear_backward(g, x, w, mask):
    """Gradients of linear w.r.t. (x, w, b), as eager's addmm backward computes them on the 2-d view
    (its mm backward multiplies in the order that suits w.t()'s column-major layout: g.T @ x)."""
    g2 = g.reshape(-1, g.shape[-1])
    x2 = x.reshape(-1, x.shape[-1])
    gx = g2.mm(w).reshape(x.shape) if mask[0] else None
    gw = g2.t().mm(x2) if mask[1] else None
    gb = g2.sum(0) if mask[2] else None
    return keep_masked(mask, gx, gw, gb)


# ---------------------------------------------------------------------------------------------- conv2d

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def conv_padding(kernel_hw, stride, padding, dilation, padding_mode):
    """Split conv2d's padding as torch does into (explicit pad for F.pad as (l, r, t, b) or None, the
    symmetric padding given to the convolution itself).

    nn.Conv2d pads explicitly for non-zero padding modes; 'same' with an even receptive field pads one
    extra zero on the right/bottom before a symmetric convolution (ATen's _convolution_mode)."""
    if padding_mode == "zeros" and type(padding) is int:   # the common case, first: this runs per record
        return None, (padding, padding)
    try:   # a loop's step asks the same at every run: remembered (errors are not)
        return _conv_padding(tuple(kernel_hw), stride, padding, dilation, padding_mode)
    except TypeError:   # a list among the params (not hashable)
        return _conv_padding.__wrapped__(kernel_hw, stride, padding, dilation, padding_mode)


@functools.lru_cache(maxsize=256, typed=True)
def _conv_padding(kernel_hw, stride, padding, dilation, padding_mode):
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"padding_mode must be one of {PADDING_MODES}, not {padding_mode!r}")
    if padding == "valid":
        return None, (0, 0)
    if padding == "same":
        if stride != 1 and _pair(stride) != (1, 1):
            raise ValueError("padding='same' needs stride=1, as in torch")
        dh, dw = _pair(dilation)
        th, tw = dh * (kernel_hw[0] - 1), dw * (kernel_hw[1] - 1)   # total padding per dimension
        lh, lw = th // 2, tw // 2
        if padding_mode != "zeros":
            return (lw, tw - lw, lh, th - lh), (0, 0)
        eh, ew = th - 2 * lh, tw - 2 * lw
        return ((0, ew, 0, eh) if eh or ew else None), (lh, lw)
    if isinstance(padding, str):
        raise ValueError(f"padding must be an int, a pair, 'same' or 'valid', not {padding!r}")
    ph, pw = _pair(padding)
    if padding_mode != "zeros" and (ph or pw):
        return (pw, pw, ph, ph), (0, 0)
    return None, (ph, pw)


def _conv_shape(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    xs, ws = x.shape, w.shape
    if len(xs) != 4 or len(ws) != 4:
        raise ValueError(f"needs a 4-d input (N, C, H, W) and a 4-d weight (out, in/groups, kh, kw); "
                         f"got {xs} and {ws}")
    if xs[1] != ws[1] * groups or ws[0] % groups:
        raise ValueError(f"input has {xs[1]} channels; weight {ws} with groups={groups} expects "
                         f"{ws[1] * groups}, and out channels divisible by groups")
    if b is not None and b.shape != (ws[0],):
        raise ValueError(f"bias must have shape ({ws[0]},), not {b.shape}")
    explicit, (ph, pw) = conv_padding(ws[2:], stride, padding, dilation, padding_mode)
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    h, wd = xs[2] + 2 * ph, xs[3] + 2 * pw
    if explicit is not None:
        h, wd = h + explicit[2] + explicit[3], wd + explicit[0] + explicit[1]
    oh, ow = (h - dh * (ws[2] - 1) - 1) // sh + 1, (wd - dw * (ws[3] - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise ValueError(f"kernel {ws[2:]} with dilation {dilation} is larger than the padded input {(h, wd)}")
    return (xs[0], ws[0], oh, ow), _same_dtype(x, w, b)


def _pad_input(x, explicit, padding_mode):
    return F.pad(x, explicit, mode="constant" if padding_mode == "zeros" else padding_mode)


def _conv2d_vjp(node, g, wants):
    mask = backward_mask(wants, *node.inputs) + ((False,) if len(node.inputs) == 2 else ())
    x, w = node.inputs[:2]
    p = node.params
    grads = call_backward(R.conv2d_backward, mask, g, x, w, stride=p["stride"], padding=p["padding"],
                          dilation=p["dilation"], groups=p["groups"], padding_mode=p["padding_mode"])
    return grads[:len(node.inputs)]


@register("conv2d", inputs=("x", "w", "b?"), params={"stride": 1, "padding": 0, "dilation": 1, "groups": 1,
                                                      "padding_mode": "zeros"}, shape=_conv_shape, vjp=_conv2d_vjp,
          flops=flops.conv2d)
def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    """2-d convolution as nn.Conv2d computes it (padding int, pair, 'same' or 'valid'; padding_mode zeros,
    reflect, replicate or circular)."""
    explicit, pad = conv_padding(w.shape[2:], stride, padding, dilation, padding_mode)
    if explicit is not None:
        x = _pad_input(x, explicit, padding_mode)
    return F.conv2d(x, w, b, _pair(stride), pad, _pair(dilation), groups)


def _conv_backward_shape(g, x, w, stride, padding, dilation, groups, padding_mode, mask):
    return masked_shapes(mask, x, w, Like((w.shape[0],), g.dtype))


@register("conv2d_backward", inputs=("g", "x", "w"),
          params={"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "padding_mode": "zeros",
                  "mask": (True, True, True)}, shape=_conv_backward_shape, method=False, flops=flops.conv2d_backward)
def conv2d_backward(g, x, w, stride, padding, dilation, groups, padding_mode, mask):
    """Gradients of conv2d w.r.t. (x, w, b): aten.convolution_backward, then the explicit pad's backward."""
    explicit, pad = conv_padding(w.shape[2:], stride, padding, dilation, padding_mode)
    padded = x if explicit is None else _pad_input(x, explicit, padding_mode)
    gx, gw, gb = aten.convolution_backward(g, padded, w, [w.shape[0]] if mask[2] else None, _pair(stride), pad,
                                           _pair(dilation), False, [0, 0], groups, list(mask))
    if mask[0] and explicit is not None:
        gx = _pad_backward(gx, x, explicit, padding_mode)
    return keep_masked(mask, gx, gw, gb)


def _pad_backward(g, x, explicit, padding_mode):
    """Gradient of F.pad(x, explicit, mode) w.r.t. x, with the kernels eager autograd uses."""
    if padding_mode == "reflect":
        return aten.reflection_pad2d_backward(g, x, list(explicit))
    if padding_mode == "replicate":
        return aten.replication_pad2d_backward(g, x, list(explicit))
    left, right, top, bottom = explicit
    h, w = x.shape[2], x.shape[3]
    if padding_mode == "zeros":
        return g[:, :, top:top + h, left:left + w]
    # circular: every padded position is a copy of x[(i - top) % h, (j - left) % w]; fold the copies back.
    rows = torch.arange(-top, h + bottom, device=g.device) % h
    cols = torch.arange(-left, w + right, device=g.device) % w
    folded = g.new_zeros(g.shape[:2] + (h, g.shape[3])).index_add_(2, rows, g)
    return g.new_zeros(x.shape).index_add_(3, cols, folded)


# ---------------------------------------------------------------------------------------------- max_pool2d

def _pool_size(size, k, s, p, d, ceil_mode):
    """Output length of one pooled dimension (ATen's pooling_output_shape)."""
    if p > k // 2:
        raise ValueError(f"padding {p} should be at most half of kernel size {k}")
    span = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    n = span // s + 1
    if ceil_mode and (n - 1) * s >= size + p:
        n -= 1
    if n <= 0:
        raise ValueError(f"kernel {k} (dilation {d}) does not fit the padded input size {size + 2 * p}")
    return n


def _pool_params(kernel_size, stride, padding, dilation):
    k = _pair(kernel_size)
    return k, (k if stride is None else _pair(stride)), _pair(padding), _pair(dilation)


def _max_pool_shape(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    shape = x.shape
    if len(shape) not in (3, 4):
        raise ValueError(f"needs a 3-d (C, H, W) or 4-d (N, C, H, W) input, not {shape}")
    k, s, p, d = _pool_params(kernel_size, stride, padding, dilation)
    out = shape[:-2] + (_pool_size(shape[-2], k[0], s[0], p[0], d[0], ceil_mode),
                        _pool_size(shape[-1], k[1], s[1], p[1], d[1], ceil_mode))
    if return_indices:
        return [(out, x.dtype), (out, torch.int64)]
    return out, x.dtype


def _max_pool_vjp(node, g, wants):
    p = node.params
    options = {k: p[k] for k in ("kernel_size", "stride", "padding", "dilation", "ceil_mode")}
    if p["return_indices"]:
        g = g[0]   # the indices output is integer: it carries no gradient
        if g is None:
            return (None,)
        return (R.max_pool2d_indices_backward(g, node.inputs[0], node.output(1), **options),)
    return (R.max_pool2d_backward(g, node.inputs[0], **options),)


def _max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    k, s, p, d = _pool_params(kernel_size, stride, padding, dilation)
    return F.max_pool2d(x, k, s, p, d, ceil_mode=ceil_mode, return_indices=return_indices)


def _max_pool2d_channels_last(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                              return_indices=False):
    """max_pool2d on a channels-last copy of a 4-d input (ATen's NCHW kernel is several times slower on small
    images), handing back contiguous values and indices: the same maxima and the same (first-in-window)
    indices."""
    if x.dim() != 4:
        return _max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    out = _max_pool2d(x.contiguous(memory_format=torch.channels_last), kernel_size, stride, padding, dilation,
                      ceil_mode, return_indices)
    if return_indices:
        return out[0].contiguous(), out[1].contiguous()
    return out.contiguous()


@register("max_pool2d", params={"kernel_size": REQUIRED, "stride": None, "padding": 0, "dilation": 1,
                                "ceil_mode": False, "return_indices": False}, shape=_max_pool_shape,
          vjp=_max_pool_vjp, cpu_variant=Variant(_max_pool2d_channels_last, "channels_last_pools"))
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """2-d max pooling (F.max_pool2d); with return_indices=True, two outputs: values and flat indices."""
    return _max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


_POOL_BACKWARD_PARAMS = {"kernel_size": REQUIRED, "stride": None, "padding": 0, "dilation": 1, "ceil_mode": False}


@register("max_pool2d_backward", inputs=("g", "x"), params=_POOL_BACKWARD_PARAMS,
          shape=lambda g, x, **_: (x.shape, g.dtype), method=False)
def max_pool2d_backward(g, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Gradient of max_pool2d w.r.t. x: the argmax indices are recomputed, then routed back by aten."""
    k, s, p, d = _pool_params(kernel_size, stride, padding, dilation)
    _, indices = aten.max_pool2d_with_indices(x, k, s, p, d, ceil_mode)
    return aten.max_pool2d_with_indices_backward(g, x, k, s, p, d, ceil_mode, indices)


@register("max_pool2d_indices_backward", inputs=("g", "x", "indices"), params=_POOL_BACKWARD_PARAMS,
          shape=lambda g, x, indices, **_: (x.shape, g.dtype), method=False)
def max_pool2d_indices_backward(g, x, indices, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Gradient of max_pool2d w.r.t. x through the argmax `indices` the forward returned."""
    k, s, p, d = _pool_params(kernel_size, stride, padding, dilation)
    return aten.max_pool2d_with_indices_backward(g, x, k, s, p, d, ceil_mode, indices)


# ---------------------------------------------------------------------------------------------- batch_norm

def _batch_norm_shape(x, running_mean, running_var, weight=None, bias=None, training=True, momentum=0.1,
                      eps=1e-5):
    if len(x.shape) not in (2, 3, 4):
        raise ValueError(f"needs a 2-d (N, C), 3-d (N, C, L) or 4-d (N, C, H, W) input, not {x.shape}")
    if (weight is None) != (bias is None):
        raise ValueError("give weight and bias together, or neither")
    c = x.shape[1]
    for name, v in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        _check_vector(name, v, c)
    if training and c > 0 and numel(x.shape) // c == 1:   # numel is -1 for a data-dependent size
        raise ValueError(f"expected more than 1 value per channel when training, got input of shape {x.shape}")
    return [(x.shape, x.dtype), (running_mean.shape, running_mean.dtype), (running_var.shape, running_var.dtype)]


def _batch_norm_vjp(node, g, wants):
    gy = g[0]   # the running statistics are buffers, as in torch: no gradient flows through them
    if gy is None:
        return (None,) * len(node.inputs)
    x, running_mean, running_var = node.inputs[:3]
    weight = node.inputs[3] if len(node.inputs) == 5 else None
    mask = backward_mask(wants, x, weight, node.inputs[4] if weight is not None else None)
    extra = (weight,) if weight is not None else ()
    gx, gw, gb = call_backward(R.batch_norm_backward, mask, gy, x, running_mean, running_var, *extra,
                               training=node.params["training"], eps=node.params["eps"])
    return (gx, None, None) + ((gw, gb) if weight is not None else ())


@register("batch_norm", inputs=("x", "running_mean", "running_var", "weight?", "bias?"),
          params={"training": True, "momentum": 0.1, "eps": 1e-5}, shape=_batch_norm_shape, vjp=_batch_norm_vjp)
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=True, momentum=0.1, eps=1e-5):
    """Batch normalisation over dim 1; three outputs (y, new running_mean, new running_var).

    Training normalises with the batch statistics and moves the running ones as torch does
    (new = (1 - momentum) * old + momentum * batch, unbiased variance); eval uses the running statistics
    and passes them through unchanged."""
    # native_batch_norm updates the statistics in place: work on copies. They are buffers, not
    # differentiable values, as in torch (detached, so autograd through this kernel agrees).
    mean, var = running_mean.detach().clone(), running_var.detach().clone()
    y = aten.native_batch_norm(x, weight, bias, mean, var, training, momentum, eps)[0]
    return y, mean, var


def _batch_norm_backward_shape(g, x, running_mean, running_var, weight=None, training=True, eps=1e-5,
                               mask=(True, True, True)):
    stats = running_mean if weight is None else weight
    return masked_shapes(mask, x, stats, stats)


def _batch_norm_keeping(box, x, running_mean, running_var, weight=None, bias=None, training=True, momentum=0.1,
                        eps=1e-5):
    """batch_norm, keeping (x, mean, inverse std) of a training batch for its backward (the step compiler)."""
    mean, var = running_mean.detach().clone(), running_var.detach().clone()
    y, save_mean, save_invstd = aten.native_batch_norm(x, weight, bias, mean, var, training, momentum, eps)
    box[:] = (x, save_mean, save_invstd) if training else (None, None, None)
    return y, mean, var


def _batch_norm_backward_kept(box, g, x, running_mean, running_var, weight=None, training=True, eps=1e-5,
                              mask=(True, True, True)):
    """batch_norm_backward with the statistics its forward kept in this run (ATen computes them with the same
    kernel either way)."""
    if not training or box[0] is not x:   # not this run's forward of this input: as recorded
        return batch_norm_backward(g, x, running_mean, running_var, weight, training, eps, mask)
    grads = aten.native_batch_norm_backward(g, x, weight, running_mean, running_var, box[1], box[2], training, eps,
                                            list(mask))
    return keep_masked(mask, *grads)


@register("batch_norm_backward", inputs=("g", "x", "running_mean", "running_var", "weight?"),
          params={"training": True, "eps": 1e-5, "mask": (True, True, True)}, shape=_batch_norm_backward_shape,
          method=False, reuses=Reuses("batch_norm", _batch_norm_keeping, _batch_norm_backward_kept,
                                      "batch_norm_stats_kept", reads=((1, 0),), same=("eps", "training"),
                                      applies=lambda params: params["training"]))
def batch_norm_backward(g, x, running_mean, running_var, weight=None, training=True, eps=1e-5,
                        mask=(True, True, True)):
    """Gradients of batch_norm w.r.t. (x, weight, bias): aten.native_batch_norm_backward with the batch
    statistics recomputed from x (training) or the running ones (eval)."""
    save_mean = save_invstd = None
    if training:
        _, save_mean, save_invstd = aten.native_batch_norm(x, None, None, None, None, True, 0.0, eps)
    grads = aten.native_batch_norm_backward(g, x, weight, running_mean, running_var, save_mean, save_invstd,
                                            training, eps, list(mask))
    return keep_masked(mask, *grads)


# ---------------------------------------------------------------------------------------------- layer_norm

def _normalized(normalized_shape):
    return (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)


def _layer_norm_shape(x, weight=None, bias=None, normalized_shape=REQUIRED, eps=1e-5):
    shape = _normalized(normalized_shape)
    if not shape or tuple(x.shape[len(x.shape) - len(shape):]) != shape or len(shape) > len(x.shape):
        raise ValueError(f"normalized_shape {shape} must be a non-empty tail of the input's shape {x.shape}")
    if (weight is None) != (bias is None):
        raise ValueError("give weight and bias together, or neither")
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None and tuple(v.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, not {v.shape}")
    return x.shape, x.dtype


def _layer_norm_vjp(node, g, wants):
    mask = backward_mask(wants, *node.inputs) + ((False, False) if len(node.inputs) == 1 else ())
    grads = call_backward(R.layer_norm_backward, mask, g, *node.inputs,
                          normalized_shape=node.params["normalized_shape"], eps=node.params["eps"])
    return grads[:len(node.inputs)]


@register("layer_norm", inputs=("x", "weight?", "bias?"), params={"normalized_shape": REQUIRED, "eps": 1e-5},
          shape=_layer_norm_shape, vjp=_layer_norm_vjp)
def layer_norm(x, weight=None, bias=None, normalized_shape=REQUIRED, eps=1e-5):
    """Layer normalisation over the trailing `normalized_shape` dimensions (F.layer_norm)."""
    return aten.native_layer_norm(x, _normalized(normalized_shape), weight, bias, eps)[0]


def _layer_norm_backward_shape(g, x, weight=None, bias=None, normalized_shape=REQUIRED, eps=1e-5,
                               mask=(True, True, True)):
    return masked_shapes(mask, x, weight, bias)


@register("layer_norm_backward", inputs=("g", "x", "weight?", "bias?"),
          params={"normalized_shape": REQUIRED, "eps": 1e-5, "mask": (True, True, True)},
          shape=_layer_norm_backward_shape, method=False)
def layer_norm_backward(g, x, weight=None, bias=None, normalized_shape=REQUIRED, eps=1e-5, mask=(True, True, True)):
    """Gradients of layer_norm w.r.t. (x, weight, bias): aten.native_layer_norm_backward, mean and rstd
    recomputed from x."""
    shape = _normalized(normalized_shape)
    _, mean, rstd = aten.native_layer_norm(x, shape, None, None, eps)
    return keep_masked(mask, *aten.native_layer_norm_backward(g, x, shape, mean, rstd, weight, bias, list(mask)))


# ---------------------------------------------------------------------------------------------- embedding

def _embedding_shape(indices, weight):
    if indices.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"indices must be int64 or int32, not {indices.dtype}")
    if len(weight.shape) != 2:
        raise ValueError(f"weight must be 2-d (num_embeddings, embedding_dim), not {weight.shape}")
    return indices.shape + (weight.shape[1],), weight.dtype


@register("embedding", inputs=("indices", "weight"), shape=_embedding_shape,
          vjp=lambda node, g, wants: (None, R.embedding_backward(g, node.inputs[0],
                                                                  num_weights=node.inputs[1].shape[0])))
def embedding(indices, weight):
    """Rows of `weight` picked by integer `indices` (any shape): F.embedding."""
    return F.embedding(indices, weight)


@register("embedding_backward", inputs=("g", "indices"), params={"num_weights": REQUIRED},
          shape=lambda g, indices, num_weights: ((num_weights, g.shape[-1]), g.dtype), method=False)
def embedding_backward(g, indices, num_weights):
    """Gradient of embedding w.r.t. its weight: aten.embedding_dense_backward (rows summed per index)."""
    return aten.embedding_dense_backward(g, indices, num_weights, -1, False)


# ---------------------------------------------------------------------------------------------- dropout

def _dropout_shape(x, p=0.5, training=True):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], not {p}")
    if not is_floating(x.dtype):
        raise TypeError(f"needs a floating-point input, not {x.dtype}")
    return x.shape, x.dtype


def _dropout_noise(like, p, generator):
    """Kept elements scaled by 1/(1-p), as ATen's dropout builds its noise, each element kept where a uniform
    float32 draw is below 1-p. Not drawn by `bernoulli_`: on Intel CPUs torch draws that from MKL's generator and
    elsewhere from its own, so one seed would give an Intel and an AMD worker different masks; `torch.rand` on the
    (host) generator draws the same numbers on any CPU, for any dtype and device (and in 2/3 of the time). Drawn
    in a contiguous tensor so that the same seed gives the same mask whatever the strides of the input."""
    keep = 1 - p
    draw = torch.rand(like.shape, generator=generator, device=generator.device)
    noise = draw.lt_(keep) if like.dtype == draw.dtype else torch.lt(draw, keep).to(like.dtype)
    return noise.div_(keep).to(like.device)


def _dropout_vjp(node, g, wants):
    p, training = node.params["p"], node.params["training"]
    if not training or p == 0:
        return (g,)
    # Every executor seeds a random op's generator with op_seed(graph seed, node id) (ravop.runtime.runner), so
    # the backward op redraws the forward's mask from that seed: R.dropout keeps one output, and no mask
    # tensor is stored or shipped between workers.
    return (R.dropout_backward(g, p=p, seed=op_seed(node.graph.seed, node.id)),)


@register("dropout", params={"p": 0.5, "training": True}, shape=_dropout_shape, vjp=_dropout_vjp, random=True,
          torch_function=(scriptable.identity, scriptable.no_params))   # exported models are in eval mode
def dropout(x, p=0.5, training=True, generator=None):
    """Zero each element with probability p and scale the rest by 1/(1-p); identity when not training."""
    if not training or p == 0:
        return x
    if p == 1:
        return x * torch.zeros((), dtype=x.dtype, device=x.device)
    return x * _dropout_noise(x, p, generator)


def _dropout_keeping(box, x, p=0.5, training=True, generator=None):
    """dropout, keeping the noise it draws in box[0] (None where it draws none) for its backward."""
    if not training or not 0 < p < 1:
        box[0] = None
        return dropout(x, p, training, generator)
    noise = box[0] = _dropout_noise(x, p, generator)
    return x * noise


def _dropout_backward_kept(box, g, p, seed):
    """dropout_backward with the mask its forward drew in this run, or, where it drew none, redrawn."""
    noise = box[0]
    if noise is None or noise.shape != g.shape or noise.dtype != g.dtype:   # the forward did not draw
        return dropout_backward(g, p, seed)
    return g * noise


# In a loop's step the backward reuses the mask its forward drew in the same run (autodiff records the redraw so
# that no mask is stored between workers; inside one step it is kept).
@register("dropout_backward", inputs=("g",), params={"p": REQUIRED, "seed": REQUIRED},
          shape=lambda g, p, seed: _dropout_shape(g, p), method=False, seed_param="seed",
          reuses=Reuses("dropout", _dropout_keeping, _dropout_backward_kept, "dropout_masks_kept", same=("p",),
                        cpu_only=False))
def dropout_backward(g, p, seed):
    """Gradient of dropout: g times the forward's mask, redrawn from the forward op's seed."""
    if p == 1:
        return g * torch.zeros((), dtype=g.dtype, device=g.device)
    generator = torch.Generator().manual_seed(seed)
    return g * _dropout_noise(g, p, generator)

