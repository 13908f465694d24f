"""Adam, AdamW and RMSprop as graph ops: `torch.optim`'s update for each parameter, recorded as one step op
that takes (param, grad, state...) and gives (param', state'...).

The optimizer keeps, per parameter, the Ops holding its state (moments start as zeros made on the worker)
and its step count (torch counts steps per parameter too); recording a step replaces them with the step
op's outputs. Nothing is kept anywhere but in the graph. State the configuration does not use (Adam's
max_exp_avg_sq without amsgrad, RMSprop's momentum buffer without momentum) passes through the step op
unchanged, so it stays the initial zeros Op rather than a new output per step: fewer ops to run.
`lr_schedule` (ravdl.v2.lr_schedules) sets each step's learning rate from the step count, inside the step op.
"""
from typing import Any, Hashable, Optional, Sequence

import ravop as R
from ravop.core.dtypes import NAMES
from ravop.record.graph import Op

from . import trained_values
from .lr_schedules import Schedule, schedule_spec


class Optimizer:
    state_names: tuple[str, ...] = ()   # the step op's state inputs, in order

    def __init__(self) -> None:
        # parameter slot (layer, name) -> {"step": int, state name: Op}
        self.state: dict[Hashable, dict[str, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """The configuration, and per parameter its step count and where its moments are
        (ravdl.v2.trained_values), not the Ops of a graph."""
        used = self.used_state()
        return {**vars(self), "state": {slot: {name: value if name == "step" or not isinstance(value, Op)
                                                else trained_values.place_of(value, f"the optimizer's {name}")
                                                for name, value in state.items() if name == "step" or name in used}
                                         for slot, state in self.state.items()}}

    def used_state(self) -> tuple[str, ...]:
        """The state names this configuration updates; the others pass through the step unchanged."""
        return self.state_names

    def state_of(self, slot: Hashable, param: R.Op) -> dict[str, Any]:
        """The state of the parameter in `slot` (any hashable key): zeros and step 0 before its first step."""
        state: Optional[dict[str, Any]] = self.state.get(slot)
        if state is None:
            state = {name: R.zeros(shape=param.shape, dtype=NAMES[param.dtype]) for name in self.state_names}
            state["step"] = 0
            self.state[slot] = state
        elif any(not isinstance(state.get(name), Op) or state[name].graph is not param.graph
                 for name in self.state_names):
            # trained in an earlier graph (or unpickled): the moments this configuration uses continue from
            # their values there; the others are zeros the step passes through
            used = self.used_state()
            state.update((name, trained_values.here(state[name], f"the optimizer's {name}") if name in used
                          else R.zeros(shape=param.shape, dtype=NAMES[param.dtype])) for name in self.state_names)
        return state

    def update(self, slot: Hashable, param: R.Op, grad: R.Op) -> R.Op:
        """Record one step for the parameter in `slot` and return its new value."""
        state = self.state_of(slot, param)
        state["step"] += 1
        new_param, *new_state = self._step(param, grad, [state[name] for name in self.state_names], state["step"])
        used = self.used_state()
        state.update((name, op) for name, op in zip(self.state_names, new_state) if name in used)
        return new_param

    def _step(self, param: R.Op, grad: R.Op, state: list[R.Op], step: int) -> Any:
        raise NotImplementedError


def _check(lr: float, eps: float, weight_decay: float) -> None:
    if lr < 0 or eps < 0 or weight_decay < 0:
        raise ValueError(f"lr, eps and weight_decay must be >= 0, got lr={lr}, eps={eps}, weight_decay={weight_decay}")


class Adam(Optimizer):
    """torch.optim.Adam, with the same arguments and defaults and the same bits: `fused=None`/False is torch's
    default single-tensor update, `fused=True` its fused kernel (faster; other rounding, which a model can amplify:
    compare with eager PyTorch's Adam of the same `fused`)."""
    state_names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

    def __init__(self, lr: float = 0.001, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-08,
                 weight_decay: float = 0, amsgrad: bool = False, lr_schedule: Optional[Schedule] = None,
                 fused: Optional[bool] = None) -> None:
        super().__init__()
        _check(lr, eps, weight_decay)
        if fused not in (None, False, True):
            raise TypeError(f"fused must be None, False or True (as torch.optim.Adam's), not {fused!r}")
        beta1, beta2 = (float(b) for b in betas)
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        self.hyper: dict[str, Any] = {"lr": float(lr), "beta1": beta1, "beta2": beta2, "eps": float(eps),
                                      "weight_decay": float(weight_decay), "amsgrad": bool(amsgrad),
                                      "lr_schedule": schedule_spec(lr_schedule), "fused": bool(fused)}

    def used_state(self) -> tuple[str, ...]:
        return self.state_names if self.hyper["amsgrad"] else self.state_names[:2]

    def _step(self, param: R.Op, grad: R.Op, state: list[R.Op], step: int) -> Any:
        # the state Ops fill the step op's state inputs (the stub cannot count a list's items)
        return R.adam_step(param, grad, *state, step=step, **self.hyper)  # type: ignore[misc, arg-type]


class AdamW(Adam):
    """torch.optim.AdamW (decoupled weight decay), with the same arguments, defaults and bits; `fused` as Adam's."""

    def __init__(self, lr: float = 0.001, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-08,
                 weight_decay: float = 0.01, amsgrad: bool = False, lr_schedule: Optional[Schedule] = None,
                 fused: Optional[bool] = None) -> None:
        super().__init__(lr, betas, eps, weight_decay, amsgrad, lr_schedule, fused)

    def _step(self, param: R.Op, grad: R.Op, state: list[R.Op], step: int) -> Any:
        return R.adamw_step(param, grad, *state, step=step, **self.hyper)  # type: ignore[misc, arg-type]


class RMSprop(Optimizer):
    """torch.optim.RMSprop (foreach=False), with the same arguments and defaults."""
    state_names = ("square_avg", "momentum_buffer", "grad_avg")

    def __init__(self, lr: float = 0.01, alpha: float = 0.99, eps: float = 1e-08, weight_decay: float = 0,
                 momentum: float = 0, centered: bool = False, lr_schedule: Optional[Schedule] = None) -> None:
        super().__init__()
        _check(lr, eps, weight_decay)
        if alpha < 0 or momentum < 0:
            raise ValueError(f"alpha and momentum must be >= 0, got alpha={alpha}, momentum={momentum}")
        self.hyper: dict[str, Any] = {
                      "lr": float(lr), "alpha": float(alpha), "eps": float(eps), "weight_decay": float(weight_decay),
                      "momentum": float(momentum), "centered": bool(centered),
                      "lr_schedule": schedule_spec(lr_schedule)}

    def used_state(self) -> tuple[str, ...]:
        return ("square_avg",) + (("momentum_buffer",) if self.hyper["momentum"] > 0 else ()) + \
            (("grad_avg",) if self.hyper["centered"] else ())

    def _step(self, param: R.Op, grad: R.Op, state: list[R.Op], step: int) -> Any:
        # the state Ops fill the step op's state inputs (the stub cannot count a list's items)
        return R.rmsprop_step(param, grad, *state, step=step, **self.hyper)  # type: ignore[misc, arg-type]
