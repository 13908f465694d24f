"""Losses of the original API: square_loss (mean squared error) and cross_entropy_loss, with backward ops
built from the aten kernels eager autograd calls (mse_loss_backward, nll_loss_backward,
_log_softmax_backward_data)."""
import torch
import torch.nn.functional as F

from ..core import op_functions as R
from ..core.dtypes import is_floating
from ..core.registry import Reuses, register
from ..core.sizes import numel
from .masked import backward_mask, call_backward, keep_masked, masked_shapes

aten = torch.ops.aten
MEAN = 1                 # ATen's Reduction::Mean
TORCH_IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index


def _check_float(name, dtype):
    if not is_floating(dtype):
        raise TypeError(f"{name} must be floating point, not {dtype}")


# ---------------------------------------------------------------------------------------------- square_loss

def same_shape(a, b):
    """Shapes equal up to data-dependent (-1) dimensions, which match any size."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _square_loss_shape(y_true, y_pred):
    _check_float("y_pred", y_pred.dtype)
    if not same_shape(y_true.shape, y_pred.shape):
        # torch would broadcast (N,) against (N, 1) into an (N, N) loss, a classic silent bug: refuse it.
        raise ValueError(f"y_true {y_true.shape} and y_pred {y_pred.shape} must have the same shape")
    return (), y_pred.dtype


def _square_loss_vjp(node, g, wants):
    return call_backward(R.square_loss_backward, backward_mask(wants, *node.inputs), g, *node.inputs)


@register("square_loss", inputs=("y_true", "y_pred"), shape=_square_loss_shape, vjp=_square_loss_vjp)
def square_loss(y_true, y_pred):
    """Mean squared error, F.mse_loss(y_pred, y_true); integer targets are compared as y_pred's dtype."""
    return F.mse_loss(y_pred, y_true.to(y_pred.dtype))


@register("square_loss_backward", inputs=("g", "y_true", "y_pred"), params={"mask": (False, True)},
          shape=lambda g, y_true, y_pred, mask: masked_shapes(mask, y_true, y_pred), method=False)
def square_loss_backward(g, y_true, y_pred, mask):
    """Gradients of square_loss w.r.t. (y_true, y_pred): aten.mse_loss_backward, as eager autograd."""
    target = y_true.to(y_pred.dtype)
    g_true = aten.mse_loss_backward(g, target, y_pred, MEAN) if mask[0] else None
    g_pred = aten.mse_loss_backward(g, y_pred, target, MEAN) if mask[1] else None
    return keep_masked(mask, g_true, g_pred)


# ---------------------------------------------------------------------------------------------- cross_entropy

def reshaped(shape, new):
    """The shape `reshape(new)` gives a tensor of `shape` (one -1 allowed), or a clear error."""
    if new is None:
        return tuple(shape)
    new = (new,) if isinstance(new, int) else tuple(new)
    n = numel(shape)
    if n < 0:   # a data-dependent size: the reshape is checked when it runs
        return new
    known = numel(d for d in new if d != -1)
    unknown = sum(1 for d in new if d == -1)
    if unknown > 1 or any(d < -1 for d in new):
        raise ValueError(f"invalid reshape {new}")
    if unknown:
        if known == 0 or n % known:
            raise ValueError(f"cannot reshape {tuple(shape)} to {new}")
        return tuple(n // known if d == -1 else d for d in new)
    if known != n:
        raise ValueError(f"cannot reshape {tuple(shape)} ({n} elements) to {new}")
    return new


def _cross_entropy_shape(y_true, y_pred, ignore_index=None, reshape_target=None, reshape_label=None):
    _check_float("y_pred", y_pred.dtype)
    pred = reshaped(y_pred.shape, reshape_target)
    label = reshaped(y_true.shape, reshape_label)
    if not pred:
        raise ValueError("y_pred needs a class dimension (C,), (N, C) or (N, C, d1, ...)")
    if y_true.dtype.is_floating_point:
        if not same_shape(label, pred):
            raise ValueError(f"probability targets must have y_pred's shape {pred}, not {label}")
        if ignore_index is not None:
            raise ValueError("ignore_index applies to class-index targets, not probabilities")
    elif y_true.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        expected = pred[:1] + pred[2:] if len(pred) > 1 else ()
        if not same_shape(label, expected):
            raise ValueError(f"class-index targets for y_pred of shape {pred} must have shape {expected}, "
                             f"not {label}")
    else:
        raise TypeError(f"y_true must hold class indices (integers) or probabilities (floats), not {y_true.dtype}")
    return (), y_pred.dtype


def _inputs(y_true, y_pred, reshape_target, reshape_label):
    """The (target, logits) pair F.cross_entropy sees: reshaped, probabilities in the logits' dtype."""
    pred = y_pred if reshape_target is None else y_pred.reshape(reshape_target)
    label = y_true if reshape_label is None else y_true.reshape(reshape_label)
    label = label.to(pred.dtype) if label.is_floating_point() else label.long()
    return label, pred


def _cross_entropy_vjp(node, g, wants):
    return call_backward(R.cross_entropy_loss_backward, backward_mask(wants, *node.inputs), g, *node.inputs,
                         **node.params)


@register("cross_entropy_loss", inputs=("y_true", "y_pred"),
          params={"ignore_index": None, "reshape_target": None, "reshape_label": None},
          shape=_cross_entropy_shape, vjp=_cross_entropy_vjp)
def cross_entropy_loss(y_true, y_pred, ignore_index=None, reshape_target=None, reshape_label=None):
    """F.cross_entropy(y_pred.view(reshape_target), y_true.view(reshape_label), ignore_index), mean over
    the targets; y_true holds class indices or class probabilities."""
    label, pred = _inputs(y_true, y_pred, reshape_target, reshape_label)
    return F.cross_entropy(pred, label, ignore_index=torch_ignore_index(ignore_index))


def _cross_entropy_keeping(box, y_true, y_pred, ignore_index=None, reshape_target=None, reshape_label=None):
    """cross_entropy_loss with class indices, as F.cross_entropy computes it (log_softmax, then nll_loss), keeping
    (y_pred, log-probabilities, total weight) for its backward (the step compiler); other targets as the op."""
    label, pred = _inputs(y_true, y_pred, reshape_target, reshape_label)
    if label.is_floating_point() or pred.dim() > 2:
        box[0] = None
        return cross_entropy_loss(y_true, y_pred, ignore_index, reshape_target, reshape_label)
    logp = torch.log_softmax(pred, 0 if pred.dim() == 1 else 1)
    loss, total_weight = aten.nll_loss_forward(logp, label, None, MEAN, torch_ignore_index(ignore_index))
    box[:] = (y_pred, logp, total_weight)
    return loss


def _cross_entropy_backward_kept(box, g, y_true, y_pred, ignore_index=None, reshape_target=None,
                                 reshape_label=None, mask=(False, True)):
    """cross_entropy_loss_backward (class-index targets) from the log-probabilities and total weight its forward
    kept in this run."""
    if box[0] is not y_pred or mask[0]:   # not this run's forward of this input: as recorded
        return cross_entropy_loss_backward(g, y_true, y_pred, ignore_index, reshape_target, reshape_label, mask)
    _, logp, total_weight = box
    label, pred = _inputs(y_true, y_pred, reshape_target, reshape_label)
    g_logp = nll_loss_backward(g, logp, label, torch_ignore_index(ignore_index), total_weight)
    g_pred = aten._log_softmax_backward_data(g_logp, logp, 0 if pred.dim() == 1 else 1, pred.dtype)
    return keep_masked(mask, None, g_pred.reshape(y_pred.shape))


@register("cross_entropy_loss_backward", inputs=("g", "y_true", "y_pred"),
          params={"ignore_index": None, "reshape_target": None, "reshape_label": None, "mask": (False, True)},
          shape=lambda g, y_true, y_pred, mask, **_: masked_shapes(mask, y_true, y_pred), method=False,
          reuses=Reuses("cross_entropy_loss", _cross_entropy_keeping, _cross_entropy_backward_kept,
                        "log_softmax_kept", reads=((1, 0), (2, 1)),
                        same=("ignore_index", "reshape_target", "reshape_label")))
def cross_entropy_loss_backward(g, y_true, y_pred, ignore_index=None, reshape_target=None, reshape_label=None,
                                mask=(False, True)):
    """Gradients of cross_entropy_loss w.r.t. (y_true, y_pred), following eager's log_softmax + nll_loss
    (class indices) or -(log_softmax * target).sum() / (numel / C) (probabilities)."""
    label, pred = _inputs(y_true, y_pred, reshape_target, reshape_label)
    class_dim = 0 if pred.dim() == 1 else 1
    logp = torch.log_softmax(pred, class_dim)
    g_true = None
    if label.is_floating_point():
        scaled = -(g / (pred.numel() // pred.shape[class_dim]))
        g_logp = scaled * label
        if mask[0]:
            g_true = (scaled * logp).reshape(y_true.shape)
    else:
        g_logp = nll_loss_backward(g, logp, label, torch_ignore_index(ignore_index))
    g_pred = None
    if mask[1]:
        g_pred = aten._log_softmax_backward_data(g_logp, logp, class_dim, pred.dtype).reshape(y_pred.shape)
    return keep_masked(mask, g_true, g_pred)


def torch_ignore_index(ignore_index):
    """The ignore_index torch takes for the op's (None: F.cross_entropy's default)."""
    return TORCH_IGNORE_INDEX if ignore_index is None else ignore_index


def nll_loss_backward(g, logp, label, ignore_index, total_weight=None):
    """Mean-reduced nll_loss's gradient w.r.t. log-probabilities, through the kernels eager's nll_loss_nd
    picks: nll_loss for (C,) and (N, C), nll_loss2d on an (N, C, 1, -1) view otherwise; `total_weight`: the
    forward's, where it was kept (else computed again)."""
    if logp.dim() <= 2:
        lp, lb, forward, backward = logp, label, aten.nll_loss_forward, aten.nll_loss_backward
    else:
        n, c = logp.shape[:2]
        lp, lb = logp.reshape(n, c, 1, -1), label.reshape(n, 1, -1)
        forward, backward = aten.nll_loss2d_forward, aten.nll_loss2d_backward
    if total_weight is None:
        _, total_weight = forward(lp, lb, None, MEAN, ignore_index)
    return backward(g, lp, lb, None, MEAN, ignore_index, total_weight).reshape(logp.shape)
