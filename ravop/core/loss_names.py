"""The names training losses are persisted under, spelled once: `fit` persists one per training step as
`training_loss_epoch_{e}_batch_{b}` and, with validation data, `validation_loss_epoch_{e}` (both 1-based); a
hand-written loop may persist `training_loss_step_{s}`. `R.fetch_losses`, History and the dashboard read them back."""
import re
from typing import Final

TRAINING_PREFIX: Final = "training_loss_"     # every training loss name starts so (a Lua script filters by it)
VALIDATION_PREFIX: Final = "validation_loss_"
TRAINING_BATCH: Final = re.compile(r"training_loss_epoch_(\d+)_batch_(\d+)\Z")
TRAINING_STEP: Final = re.compile(r"training_loss_step_(\d+)\Z")
VALIDATION: Final = re.compile(r"validation_loss_epoch_(\d+)\Z")


def training_loss_name(epoch: int, batch: int) -> str:
    """The loss of batch `batch` of epoch `epoch`, both 1-based."""
    return f"training_loss_epoch_{epoch}_batch_{batch}"


def validation_loss_name(epoch: int) -> str:
    """The validation loss after epoch `epoch` (1-based)."""
    return f"validation_loss_epoch_{epoch}"


def step_loss_name(step: int) -> str:
    """The loss of training step `step` (1-based) of a hand-written loop."""
    return f"training_loss_step_{step}"
