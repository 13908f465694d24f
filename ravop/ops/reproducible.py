"""The reproducible numerics mode's kernels (`RAVOP_NUMERICS=reproducible`, ravop/core/numerics_mode.py): for each
op, a kernel giving the same bits on every x86 CPU class and every thread count, and the one table saying which
op runs which (`declare_reproducible` sets `OpDef.reproducible`; the runner picks it, and refuses an op without).

Three ways, per op (docs/reports/reproducible_numerics.md measures each):
- ORDER_FREE: the op's own kernel, because no output depends on an order of additions: copies, comparisons, one
  correctly rounded IEEE operation per element (+ - * / sqrt), and the transcendental functions whose vectorised
  and scalar code measured the same bits on the three classes (exp, log, tanh, erf).
- exact sums and products (ravop/ops/exact.py): reductions, matmul, linear, convolution (unfold, then an exact
  product), and everything built on a reduction (softmax, normalisation, losses).
- composed: ops whose ATen kernel fuses its arithmetic differently per CPU (FMA, polynomial sigmoid, lerp,
  addcmul) written as a fixed sequence of the ORDER_FREE operations above.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core import registry
from ..core.dtypes import as_dtype
from . import rules
from .activations import SELU_ALPHA, SELU_SCALE
from .creation import _size
from .exact import exact_matmul, exact_mean, exact_sum
from .linalg import _promoted, _tensordot_axes
from .lr_schedule import scheduled_lr
from .masked import keep_masked
from .nn import _normalized, _pad_backward, _pad_input, _pair, conv_padding
from .optim import _counted

# Ops whose own kernel is already reproducible (checked on every class and thread count by
# tests/ops/test_reproducible_numerics.py, as every op of this module is).
ORDER_FREE = (
    "add sub mul div neg pos abs sign square cube square_root exp natlog round clip "
    "equal not_equal greater greater_equal less less_equal logical_and logical_or logical_xor logical_not where "
    "reshape transpose flatten squeeze expand_dims ravel broadcast_to concat stack split slice index gather "
    "take_along_axis pad tile repeat reverse shape size cast one_hot_encoding zeros arange step_row "
    "relu relu_backward threshold threshold_backward hardtanh hardtanh_backward leaky_relu leaky_relu_backward "
    "hardshrink hardshrink_backward softshrink softshrink_backward tanh max min argmax argmin softsign "
    "softsign_backward tanhshrink combine_to_list join_to_list set_value find_indices ravint argsort sort unique "
    "median mode "
    "max_pool2d max_pool2d_backward max_pool2d_indices_backward embedding dropout dropout_backward random "
    "tuple_get loop_stop").split()


def _float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.to(rules.float_dtype(x.dtype))


def _dims(x: Tensor, axis: Any) -> list[int]:
    return [d % max(x.dim(), 1) for d in rules.kernel_dims(x, axis)]


# ------------------------------------------------------------------------------------------------ reductions

def sum_(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    dims = _dims(x, axis)
    if not x.is_floating_point():   # integers add exactly in any order: torch's own sum
        return torch.sum(x, dim=dims, keepdim=keepdims) if dims or not x.dim() else x.to(rules.sum_dtype(x.dtype))
    return exact_sum(x, dims, keepdims) if dims else x.clone()


def mean(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    x = _float(x)
    dims = _dims(x, axis)
    return exact_mean(x, dims, keepdims) if dims else x.clone()


def sum_to(x: Tensor, shape: Any) -> Tensor:
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    lead = x.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1]
    return sum_(x, tuple(dims), True).reshape(shape) if dims else x.reshape(shape)


def variance(x: Tensor, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> Tensor:
    x = _float(x)
    dims = _dims(x, axis)
    centred = x - exact_mean(x, dims, True)
    count = math.prod(x.shape[d] for d in dims)
    return exact_sum(centred * centred, dims, keepdims) / (count - ddof)


def std(x: Tensor, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> Tensor:
    return torch.sqrt(variance(x, axis, ddof, keepdims))


# ------------------------------------------------------------------------------------------------ products

def matmul(x: Tensor, y: Tensor) -> Tensor:
    x, y = _promoted(x, y)
    return exact_matmul(x, y) if x.is_floating_point() else torch.matmul(x, y)   # integers: exact in any order


def linear(x: Tensor, w: Tensor, b: Optional[Tensor] = None) -> Tensor:
    out = exact_matmul(x, w.t())
    return out if b is None else out + b


def linear_backward(g: Tensor, x: Tensor, w: Tensor, mask: tuple[bool, ...]) -> tuple[Tensor, ...]:
    g2 = g.reshape(-1, g.shape[-1])
    x2 = x.reshape(-1, x.shape[-1])
    gx = exact_matmul(g2, w).reshape(x.shape) if mask[0] else None
    gw = exact_matmul(g2.t(), x2) if mask[1] else None
    gb = exact_sum(g2, [0]) if mask[2] else None
    return keep_masked(mask, gx, gw, gb)


def tensordot(x: Tensor, y: Tensor, axes: Any = 2) -> Tensor:
    """torch.tensordot as one exact product: x's free dims by its contracted ones, y's contracted by its free."""
    x, y = _promoted(x, y)
    ax, ay = _tensordot_axes(axes, x.dim(), y.dim())
    if not x.is_floating_point():
        return torch.tensordot(x, y, dims=(list(ax), list(ay)))   # integers: exact in any order
    free_x = [d for d in range(x.dim()) if d not in ax]
    free_y = [d for d in range(y.dim()) if d not in ay]
    k = math.prod(x.shape[d] for d in ax)
    rows = x.permute(free_x + list(ax)).reshape(-1, k)
    cols = y.permute(list(ay) + free_y).reshape(k, -1)
    return exact_matmul(rows, cols).reshape([x.shape[d] for d in free_x] + [y.shape[d] for d in free_y])


def dot(x: Tensor, y: Tensor) -> Tensor:
    if not x.dim() or not y.dim():
        return torch.mul(x, y)
    return tensordot(x, y, ([x.dim() - 1], [max(y.dim() - 2, 0)]))


def embedding_backward(g: Tensor, indices: Tensor, num_weights: int) -> Tensor:
    """The rows of g added per index: one-hot(indices)^T @ g, an exact product (ATen's scatter-add order varies)."""
    rows = g.reshape(-1, g.shape[-1])
    onehot = F.one_hot(indices.reshape(-1).long(), num_weights).to(g.dtype)
    return exact_matmul(onehot.t(), rows)


def _unfolded(x: Tensor, w: Tensor, stride: Any, pad: Any, dilation: Any) -> Tensor:
    """im2col: (N, C*kh*kw, L), copies only."""
    return F.unfold(x, tuple(w.shape[2:]), _pair(dilation), pad if isinstance(pad, tuple) else _pair(pad),
                    _pair(stride))


def _out_hw(x: Tensor, w: Tensor, stride: Any, pad: Any, dilation: Any) -> tuple[int, int]:
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(pad), _pair(dilation)
    kh, kw = w.shape[2:]
    return ((x.shape[2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (x.shape[3] + 2 * pw - dw * (kw - 1) - 1) // sw + 1)


def _grouped_product(weights: Tensor, cols: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """(N, G, P, L) from weights (G, P, Q) and columns (N, G, Q, L): per group one exact product over all N * L
    columns at once (a batch of N small products costs N times the calls' overhead); `dtype` as exact_matmul's."""
    n, groups, q, positions = cols.shape
    return torch.stack([exact_matmul(weights[i], cols[:, i].transpose(0, 1).reshape(q, n * positions), dtype)
                        .reshape(weights.shape[1], n, positions).transpose(0, 1) for i in range(groups)], 1)


def conv2d(x: Tensor, w: Tensor, b: Optional[Tensor] = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1, padding_mode: str = "zeros") -> Tensor:
    explicit, pad = conv_padding(w.shape[2:], stride, padding, dilation, padding_mode)
    if explicit is not None:
        x = _pad_input(x, explicit, padding_mode)
    n, o = x.shape[0], w.shape[0]
    oh, ow = _out_hw(x, w, stride, pad, dilation)
    cols = _unfolded(x, w, stride, pad, dilation)            # (N, C*k, L)
    per_group = w[0].numel()                                 # C/G * kh * kw
    cols = cols.reshape(n, groups, per_group, oh * ow)       # per group (N, G, C/G*k, L)
    weights = w.reshape(groups, o // groups, per_group)      # (G, O/G, C/G*k)
    out = _grouped_product(weights, cols).reshape(n, o, oh, ow)
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def conv2d_backward(g: Tensor, x: Tensor, w: Tensor, stride: Any, padding: Any, dilation: Any, groups: int,
                    padding_mode: str, mask: tuple[bool, ...]) -> tuple[Tensor, ...]:
    """Gradients of conv2d: the weight's an exact product of g with the unfolded input over (N, L); the input's an
    exact product of the weight with g, folded back (col2im adds each pixel's contributions in its fixed loop
    order, in float64, then rounds once)."""
    explicit, pad = conv_padding(w.shape[2:], stride, padding, dilation, padding_mode)
    padded = x if explicit is None else _pad_input(x, explicit, padding_mode)
    n, o = g.shape[:2]
    g3 = g.reshape(n, groups, o // groups, -1)               # (N, G, O/G, L)
    gx = gw = gb = None
    if mask[1]:
        cols = _unfolded(padded, w, stride, pad, dilation).reshape(n, groups, w[0].numel(), g3.shape[-1])
        gw = exact_matmul(g3.permute(1, 2, 0, 3).reshape(groups, o // groups, n * g3.shape[-1]),
                          cols.permute(1, 0, 3, 2).reshape(groups, n * g3.shape[-1], w[0].numel())).reshape(w.shape)
    if mask[0]:
        weights = w.reshape(groups, o // groups, -1).transpose(1, 2)          # (G, C/G*k, O/G)
        cols = _grouped_product(weights, g3, torch.float64).reshape(n, groups * w[0].numel(), g3.shape[-1])
        gx = F.fold(cols, tuple(padded.shape[2:]), tuple(w.shape[2:]), _pair(dilation),
                    pad if isinstance(pad, tuple) else _pair(pad), _pair(stride)).to(g.dtype)
        if explicit is not None:
            gx = _pad_backward(gx, x, explicit, padding_mode)
    if mask[2]:
        gb = exact_sum(g, [0, 2, 3])
    return keep_masked(mask, gx, gw, gb)


# ---------------------------------------------------------------------------------------- softmax family

def softmax(x: Tensor, axis: int = -1) -> Tensor:
    e = torch.exp(x - x.amax(axis, keepdim=True))
    return e / exact_sum(e, [axis], True)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    shifted = x - x.amax(axis, keepdim=True)
    return shifted - torch.log(exact_sum(torch.exp(shifted), [axis], True))


def softmin(x: Tensor, axis: int = -1) -> Tensor:
    return softmax(-x, axis)


def softmax_backward(g: Tensor, y: Tensor, axis: int = -1) -> Tensor:
    gy = g * y
    return gy - y * exact_sum(gy, [axis], True)


def log_softmax_backward(g: Tensor, y: Tensor, axis: int = -1) -> Tensor:
    return g - torch.exp(y) * exact_sum(g, [axis], True)


def softmin_backward(g: Tensor, y: Tensor, axis: int = -1) -> Tensor:
    return -softmax_backward(g, y, axis)


# ------------------------------------------------------------------------------- activations and losses

def sigmoid(x: Tensor) -> Tensor:
    return 1 / (1 + torch.exp(-x))   # torch.sigmoid's vectorised kernel differs by CPU; exp does not


def sigmoid_backward(g: Tensor, y: Tensor) -> Tensor:
    return g * (y * (1 - y))


def tanh_backward(g: Tensor, y: Tensor) -> Tensor:
    return g * (1 - y * y)


def tanhshrink_backward(g: Tensor, x: Tensor) -> Tensor:
    t = torch.tanh(x)
    return g - tanh_backward(g, t)


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    scaled = x * beta
    return torch.where(scaled > threshold, x, torch.log(1 + torch.exp(scaled)) / beta)   # log1p varies by CPU


def softplus_backward(g: Tensor, x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    scaled = x * beta
    return torch.where(scaled > threshold, g, g / (1 + torch.exp(-scaled)))


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    return torch.where(x > 0, x, (torch.exp(x) - 1) * alpha)   # expm1 varies by CPU


def elu_backward(g: Tensor, x: Tensor, alpha: float = 1.0) -> Tensor:
    return torch.where(x > 0, g, g * (torch.exp(x) * alpha))


def selu(x: Tensor) -> Tensor:
    return elu(x, SELU_ALPHA) * SELU_SCALE


def selu_backward(g: Tensor, x: Tensor) -> Tensor:
    return torch.where(x > 0, g * SELU_SCALE, g * (torch.exp(x) * (SELU_ALPHA * SELU_SCALE)))


def logsigmoid(x: Tensor) -> Tensor:
    return torch.minimum(x, torch.zeros_like(x)) - torch.log(1 + torch.exp(-torch.abs(x)))


def logsigmoid_backward(g: Tensor, x: Tensor) -> Tensor:
    return g / (1 + torch.exp(x))


_SQRT1_2, _SQRT_2_PI = 0.7071067811865476, 0.7978845608028654


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    if approximate == "tanh":
        return 0.5 * x * (1 + torch.tanh(_SQRT_2_PI * (x + 0.044715 * (x * x * x))))
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")
    return 0.5 * x * (1 + torch.erf(x * _SQRT1_2))


def gelu_backward(g: Tensor, x: Tensor, approximate: str = "none") -> Tensor:
    if approximate == "tanh":
        inner = _SQRT_2_PI * (x + 0.044715 * (x * x * x))
        t = torch.tanh(inner)
        d_inner = _SQRT_2_PI * (1 + 3 * 0.044715 * (x * x))
        return g * (0.5 * (1 + t) + 0.5 * x * ((1 - t * t) * d_inner))
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")
    cdf = 0.5 * (1 + torch.erf(x * _SQRT1_2))
    pdf = torch.exp(-0.5 * (x * x)) * (_SQRT_2_PI * 0.5)
    return g * (cdf + x * pdf)


def _ce_inputs(y_true: Tensor, y_pred: Tensor, reshape_target: Any, reshape_label: Any,
               ignore_index: Any) -> tuple[Tensor, Tensor, int, Tensor]:
    """(target probabilities per position, logits, class dim, the count the mean divides by): class indices
    become one-hot rows, zero where the target is `ignore_index`, and the mean is over the others (as torch)."""
    pred = y_pred if reshape_target is None else y_pred.reshape(reshape_target)
    label = y_true if reshape_label is None else y_true.reshape(reshape_label)
    class_dim = 0 if pred.dim() == 1 else 1
    if label.is_floating_point():
        return label.to(pred.dtype), pred, class_dim, torch.tensor(pred.numel() // pred.shape[class_dim])
    label = label.long()
    kept = torch.ones_like(label, dtype=torch.bool) if ignore_index is None else label != ignore_index
    onehot = F.one_hot(torch.where(kept, label, 0), pred.shape[class_dim]).to(pred.dtype)
    onehot = onehot * kept.unsqueeze(-1).to(pred.dtype)
    return onehot.movedim(-1, class_dim), pred, class_dim, kept.sum()


def cross_entropy_loss(y_true: Tensor, y_pred: Tensor, ignore_index: Any = None, reshape_target: Any = None,
                       reshape_label: Any = None) -> Tensor:
    target, pred, class_dim, count = _ce_inputs(y_true, y_pred, reshape_target, reshape_label, ignore_index)
    return -exact_sum(log_softmax(pred, class_dim) * target, list(range(pred.dim()))) / count.to(pred.dtype)


def cross_entropy_loss_backward(g: Tensor, y_true: Tensor, y_pred: Tensor, ignore_index: Any = None,
                                reshape_target: Any = None, reshape_label: Any = None,
                                mask: tuple[bool, ...] = (False, True)) -> tuple[Tensor, ...]:
    """-(g / count) * (target - softmax * sum(target over classes)); for class indices that sum is 1 (0 where
    ignored): no reduction at all."""
    target, pred, class_dim, count = _ce_inputs(y_true, y_pred, reshape_target, reshape_label, ignore_index)
    logp = log_softmax(pred, class_dim)
    scaled = -(g / count.to(pred.dtype))
    g_true = (scaled * logp).reshape(y_true.shape) if mask[0] and y_true.is_floating_point() else None
    g_pred = None
    if mask[1]:
        weight = exact_sum(target, [class_dim], True) if y_true.is_floating_point() else \
            target.amax(class_dim, keepdim=True)
        g_pred = (scaled * (target - torch.exp(logp) * weight)).reshape(y_pred.shape)
    return keep_masked(mask, g_true, g_pred)


def square_loss(y_true: Tensor, y_pred: Tensor) -> Tensor:
    diff = y_pred - y_true.to(y_pred.dtype)
    return exact_mean(diff * diff, list(range(diff.dim())))


def square_loss_backward(g: Tensor, y_true: Tensor, y_pred: Tensor, mask: tuple[bool, ...]) -> tuple[Tensor, ...]:
    diff = y_pred - y_true.to(y_pred.dtype)
    scaled = diff * (2 * g / max(diff.numel(), 1))
    return keep_masked(mask, -scaled if mask[0] else None, scaled if mask[1] else None)


# --------------------------------------------------------------------------------------------- normalisation

def _normalise(x: Tensor, dims: list[int], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(x - mean) * rstd over `dims`, with the mean and the biased variance (kept dims)."""
    mu = exact_mean(x, dims, True)
    centred = x - mu
    var = exact_mean(centred * centred, dims, True)
    return centred * torch.rsqrt(var + eps), mu, var


def batch_norm(x: Tensor, running_mean: Tensor, running_var: Tensor, weight: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, training: bool = True, momentum: float = 0.1,
               eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    shape = [1, -1] + [1] * (x.dim() - 2)
    dims = [0] + list(range(2, x.dim()))
    if training:
        xhat, mu, var = _normalise(x, dims, eps)
        count = x.numel() // x.shape[1]
        unbiased = var.reshape(-1) * (count / max(count - 1, 1))
        mean_out = running_mean * (1 - momentum) + mu.reshape(-1) * momentum
        var_out = running_var * (1 - momentum) + unbiased * momentum
    else:
        xhat = (x - running_mean.reshape(shape)) * torch.rsqrt(running_var.reshape(shape) + eps)
        mean_out, var_out = running_mean.clone(), running_var.clone()
    y = xhat if weight is None else xhat * weight.reshape(shape)
    return (y if bias is None else y + bias.reshape(shape)), mean_out, var_out


def batch_norm_backward(g: Tensor, x: Tensor, running_mean: Tensor, running_var: Tensor,
                        weight: Optional[Tensor] = None, training: bool = True, eps: float = 1e-5,
                        mask: tuple[bool, ...] = (True, True, True)) -> tuple[Tensor, ...]:
    shape = [1, -1] + [1] * (x.dim() - 2)
    dims = [0] + list(range(2, x.dim()))
    if training:
        xhat, _, var = _normalise(x, dims, eps)
        rstd = torch.rsqrt(var + eps)
    else:
        rstd = torch.rsqrt(running_var.reshape(shape) + eps)
        xhat = (x - running_mean.reshape(shape)) * rstd
    gb = exact_sum(g, dims)
    gw = exact_sum(g * xhat, dims)
    scale = rstd if weight is None else rstd * weight.reshape(shape)
    if training:
        count = x.numel() // x.shape[1]
        gx = scale * (g - gb.reshape(shape) / count - xhat * (gw.reshape(shape) / count))
    else:
        gx = g * scale
    return keep_masked(mask, gx, gw if mask[1] else None, gb if mask[2] else None)


def layer_norm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               normalized_shape: Any = None, eps: float = 1e-5) -> Tensor:
    dims = list(range(x.dim() - len(_normalized(normalized_shape)), x.dim()))
    y, _, _ = _normalise(x, dims, eps)
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def layer_norm_backward(g: Tensor, x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                        normalized_shape: Any = None, eps: float = 1e-5,
                        mask: tuple[bool, ...] = (True, True, True)) -> tuple[Tensor, ...]:
    n = len(_normalized(normalized_shape))
    dims, lead = list(range(x.dim() - n, x.dim())), list(range(x.dim() - n))
    xhat, _, var = _normalise(x, dims, eps)
    gxhat = g if weight is None else g * weight
    gx = torch.rsqrt(var + eps) * (gxhat - exact_mean(gxhat, dims, True) - xhat * exact_mean(gxhat * xhat, dims, True))
    gw = exact_sum(g * xhat, lead) if mask[1] and weight is not None else None
    gb = exact_sum(g, lead) if mask[2] and bias is not None else None
    return keep_masked(mask, gx, gw, gb)


def random_uniform(low: float = 0.0, high: float = 1.0, size: Any = None, dtype: str = "float32", *,
                   generator: torch.Generator) -> Tensor:
    """Uniform draws in [0, 1) (the same bits on every class), then scaled by separate IEEE operations: torch's
    uniform_(low, high) scales them with a fused multiply-add on some CPUs."""
    unit = torch.rand(_size(size), generator=generator, dtype=as_dtype(dtype), device=generator.device)
    return unit * (high - low) + low


# ----------------------------------------------------------------------------------------------------- Adam

def _adam(decoupled: bool, decay: float) -> registry.Kernel:
    """torch.optim.Adam's single-tensor step (AdamW's with `decoupled`) written out in + - * / sqrt: torch's lerp_
    and addcmul_ fuse differently per CPU."""
    def step_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, max_exp_avg_sq: Tensor, step: int,
              lr: float = 0.001, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
              weight_decay: float = decay, amsgrad: bool = False, maximize: bool = False, lr_schedule: Any = None,
              fused: bool = False) -> tuple[Tensor, ...]:
        _counted(step)
        lr = scheduled_lr(lr, lr_schedule, step)
        grad = -grad if maximize else grad
        if weight_decay != 0:
            if decoupled:
                param = param * (1 - lr * weight_decay)
            else:
                grad = grad + param * weight_decay
        exp_avg = exp_avg + (grad - exp_avg) * (1 - beta1)
        exp_avg_sq = exp_avg_sq * beta2 + (grad * grad) * (1 - beta2)
        if amsgrad:
            max_exp_avg_sq = torch.maximum(max_exp_avg_sq, exp_avg_sq)
        second = max_exp_avg_sq if amsgrad else exp_avg_sq
        step_size = lr / (1 - beta1 ** float(step))
        denom = torch.sqrt(second) / ((1 - beta2 ** float(step)) ** 0.5) + eps
        return param - (exp_avg / denom) * step_size, exp_avg, exp_avg_sq, max_exp_avg_sq
    return step_


KERNELS: dict[str, registry.Kernel] = {
    "sum": sum_, "mean": mean, "sum_to": sum_to, "variance": variance, "std": std,
    "matmul": matmul, "tensordot": tensordot, "dot": dot, "embedding_backward": embedding_backward,
    "tanhshrink_backward": tanhshrink_backward, "softplus": softplus, "softplus_backward": softplus_backward,
    "elu": elu, "elu_backward": elu_backward, "selu": selu, "selu_backward": selu_backward,
    "logsigmoid": logsigmoid, "logsigmoid_backward": logsigmoid_backward, "linear": linear, "linear_backward": linear_backward,
    "conv2d": conv2d, "conv2d_backward": conv2d_backward,
    "softmax": softmax, "log_softmax": log_softmax, "softmin": softmin, "softmax_backward": softmax_backward,
    "log_softmax_backward": log_softmax_backward, "softmin_backward": softmin_backward,
    "sigmoid": sigmoid, "sigmoid_backward": sigmoid_backward, "tanh_backward": tanh_backward,
    "gelu": gelu, "gelu_backward": gelu_backward,
    "cross_entropy_loss": cross_entropy_loss, "cross_entropy_loss_backward": cross_entropy_loss_backward,
    "square_loss": square_loss, "square_loss_backward": square_loss_backward,
    "batch_norm": batch_norm, "batch_norm_backward": batch_norm_backward,
    "layer_norm": layer_norm, "layer_norm_backward": layer_norm_backward,
    "random_uniform": random_uniform, "adam_step": _adam(False, 0.0), "adamw_step": _adam(True, 0.01),
}

registry.declare_reproducible({**{name: registry.get(name).kernel for name in ORDER_FREE}, **KERNELS})
