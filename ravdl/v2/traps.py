"""Settings that run but rarely do what was meant (issue 45), each met with a warning or an error that names the
fix: a softmax output trained with the CrossEntropy loss, BatchNormalization's default momentum, an optimizer given
by name, and Keras' `fit(epochs=...)`. A warning is given once: per model for the softmax, per process for the
momentum. Warnings are `RavdlTrapWarning`s pointing at the user's line (`warnings.filterwarnings("ignore",
category=RavdlTrapWarning)` silences them)."""
import sys
import warnings
import weakref
from typing import Any, Mapping

import ravop as R
from ravop.record.source import LIBRARY_DIRS

from .optimizers import Optimizer


class RavdlTrapWarning(UserWarning):
    """A ravdl setting that runs but probably does not do what was meant; the message names the fix."""


class OriginalDefault(float):
    """A default value of the original API, told apart from the same number given on purpose (`x is DEFAULT`)."""


_given: set[str] = set()                                # the once-per-process warnings given
_softmax_models: "weakref.WeakSet[Any]" = weakref.WeakSet()   # models warned of softmax before CrossEntropy


def warn(message: str) -> None:
    """warnings.warn(message) as a RavdlTrapWarning at the innermost frame outside ravdl and ravop."""
    level, frame = 1, sys._getframe(0)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(LIBRARY_DIRS):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, RavdlTrapWarning, stacklevel=level)


def softmax_before_cross_entropy(model: Any, loss: Any) -> None:
    """Warn once per model if `loss` is R.cross_entropy_loss of a softmax (an Activation('softmax') layer last)."""
    if (getattr(loss, "op", None) == R.cross_entropy_loss.__name__ and loss.inputs[1].op == R.softmax.__name__
            and model not in _softmax_models):
        _softmax_models.add(model)
        warn(f"{type(model).__name__}'s output is a softmax and its loss CrossEntropy, which takes logits and applies "
             "softmax itself (as torch's cross_entropy does): softmax is applied twice, which slows and can stall "
             "training. Remove the last Activation('softmax') (or R.softmax); apply R.softmax to predict()'s "
             "output where probabilities are wanted (argmax is the same on logits)")


def default_momentum(layer: str) -> None:
    """Warn once per process that a batch norm layer has the original API's momentum=0.99, in torch's meaning."""
    if "momentum" not in _given:
        _given.add("momentum")
        warn(f"{layer}'s default momentum=0.99 (the original API's) has torch's meaning: each training step the "
             "running statistics take 0.99 of the batch's and keep 0.01 of their own, so eval mode normalises by "
             "about the last batch alone. torch's default is momentum=0.1: pass momentum=0.1 (or momentum=0.99 "
             "explicitly to keep it without this warning)")


def check_optimizer(optimizer: Any, where: str) -> None:
    """A TypeError unless `optimizer` is a ravdl.v2.optimizers instance or None."""
    if optimizer is not None and not isinstance(optimizer, Optimizer):
        raise TypeError(f"{where} takes a ravdl.v2.optimizers instance (e.g. ravdl.v2.optimizers.Adam(), or "
                        f"Adam(lr=0.001) after `from ravdl.v2.optimizers import Adam`), not {optimizer!r}"
                        + (" (a name)" if isinstance(optimizer, str) else ""))


def refuse_fit_keywords(model: Any, given: Mapping[str, Any]) -> None:
    """A TypeError for keywords fit does not take, pointing Keras' epochs= to n_epochs=."""
    if "epochs" in given:
        raise TypeError(f"{type(model).__name__}.fit() takes n_epochs=, not Keras' epochs=: "
                        f"fit(X, y, n_epochs={given['epochs']!r}, ...)")
    if given:
        raise TypeError(f"{type(model).__name__}.fit() got an unexpected keyword argument {next(iter(given))!r}")
