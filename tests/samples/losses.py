"""Samples for square_loss and cross_entropy_loss (ravop/ops/loss_functions.py) and their backward ops.

References are torch.nn.functional.mse_loss / cross_entropy with the original ravop's argument handling
(y_pred.view(reshape_target), y_true.view(reshape_label)), and torch.autograd through them."""
import torch
import torch.nn.functional as TF

from . import Sample
from .nn import autograd_grads, randn


def _mse_ref(y_true, y_pred):
    return TF.mse_loss(y_pred, y_true.to(y_pred.dtype))


def _ce_ref(y_true, y_pred, ignore_index=None, reshape_target=None, reshape_label=None):
    pred = y_pred if reshape_target is None else y_pred.view(reshape_target)
    label = y_true if reshape_label is None else y_true.view(reshape_label)
    return TF.cross_entropy(pred, label, ignore_index=-100 if ignore_index is None else ignore_index)


def _loss_backward_ref(forward):
    def reference(g, y_true, y_pred, mask=(False, True), **params):
        wrt = (0, 1) if y_true.is_floating_point() else (1,)
        grads = autograd_grads(lambda t, p: forward(t, p, **params), (y_true, y_pred), g, wrt)
        grads = grads if len(grads) == 2 else (torch.zeros(()),) + grads   # integer targets: no gradient
        return tuple(gr for gr, wanted in zip(grads, mask) if wanted)
    return reference


def _probabilities(*shape, dim=1):
    return torch.softmax(randn(*shape) * 2, dim)


_LABELS = torch.tensor([0, 3, 1, 1, 2])

SAMPLES = {
    "square_loss": [
        Sample((randn(4, 3), randn(4, 3)), reference=_mse_ref),
        Sample((torch.eye(3, dtype=torch.int64)[[0, 2, 1, 1]], randn(4, 3)), reference=_mse_ref,
               note="integer one-hot targets"),
        Sample((randn(5, dtype=torch.float64), randn(5, dtype=torch.float64)), reference=_mse_ref, note="1-d"),
    ],
    "square_loss_backward": [
        Sample((randn(()), randn(4, 3), randn(4, 3)), reference=_loss_backward_ref(_mse_ref)),
        Sample((randn(()), randn(4, 3), randn(4, 3)), {"mask": (True, True)}, reference=_loss_backward_ref(_mse_ref),
               note="target gradient too"),
    ],
    "cross_entropy_loss": [
        Sample((_LABELS, randn(5, 4)), reference=_ce_ref, note="class indices"),
        Sample((_LABELS, randn(5, 4)), {"ignore_index": 1}, reference=_ce_ref, note="ignore_index"),
        Sample((torch.tensor([[0, 3, -1], [-1, 2, 2]]), randn(2, 3, 4)),
               {"ignore_index": -1, "reshape_target": (-1, 4), "reshape_label": (-1,)}, reference=_ce_ref,
               note="the original's GPT example: reshape both, ignore -1"),
        Sample((torch.tensor([[0, 3, 2], [1, 1, 0]]), randn(2, 4, 3)), reference=_ce_ref, note="(N, C, d1)"),
        Sample((torch.randint(0, 3, (2, 2, 2), generator=torch.Generator().manual_seed(0)), randn(2, 3, 2, 2)),
               reference=_ce_ref, note="(N, C, H, W)"),
        Sample((torch.tensor(2), randn(4)), reference=_ce_ref, note="unbatched (C,)"),
        Sample((_probabilities(5, 4), randn(5, 4)), reference=_ce_ref, note="class probabilities"),
        Sample((_probabilities(2, 3, 4), randn(2, 3, 4)), reference=_ce_ref, note="probabilities, (N, C, d1)"),
        Sample((torch.tensor([0, 1], dtype=torch.int32), randn(2, 3)), reference=lambda t, p: _ce_ref(t.long(), p),
               note="int32 labels"),
    ],
    "cross_entropy_loss_backward": [
        Sample((randn(()), _LABELS, randn(5, 4)), reference=_loss_backward_ref(_ce_ref)),
        Sample((randn(()), torch.tensor([[0, 3, -1], [-1, 2, 2]]), randn(2, 3, 4)),
               {"ignore_index": -1, "reshape_target": (-1, 4), "reshape_label": (-1,)},
               reference=_loss_backward_ref(_ce_ref), note="reshaped, ignore_index"),
        Sample((randn(()), torch.tensor([[0, 3, 2], [1, 1, 0]]), randn(2, 4, 3)),
               reference=_loss_backward_ref(_ce_ref), note="(N, C, d1)"),
        Sample((randn(()), _probabilities(5, 4), randn(5, 4)), {"mask": (True, True)},
               reference=_loss_backward_ref(_ce_ref), note="probabilities, both gradients"),
    ],
}
