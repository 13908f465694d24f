"""Learning-rate schedules for ravdl's optimizers, as torch.optim.lr_scheduler's of the same names stepped after
every optimizer step (not every epoch):

    model = NeuralNetwork(Adam(lr=0.01, lr_schedule=CosineAnnealingLR(T_max=200)), loss="CrossEntropy")
    Adam(lr=0.01, lr_schedule=SequentialLR([LinearLR(0.1, total_iters=20), CosineAnnealingLR(180)], [20]))

The schedule travels in the optimizer step op's params and the op computes its step's learning rate from its step
counter (ravop.ops.lr_schedule), so a fit folded into a loop, or a strategy's replicas (each with its own count,
kept across rounds), schedule their steps without one more op in the plan."""
from typing import Any, Optional, Sequence

from ravop.ops.lr_schedule import check_schedule


class Schedule:
    """A schedule as the plain JSON its step ops carry (`spec`)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = check_schedule(spec)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.spec.items() if k != "kind")
        return f"{type(self).__name__}({fields})"


class StepLR(Schedule):
    def __init__(self, step_size: int, gamma: float = 0.1) -> None:
        super().__init__({"kind": "step", "step_size": step_size, "gamma": float(gamma)})


class ExponentialLR(Schedule):
    def __init__(self, gamma: float) -> None:
        super().__init__({"kind": "exponential", "gamma": float(gamma)})


class CosineAnnealingLR(Schedule):
    def __init__(self, T_max: int, eta_min: float = 0.0) -> None:
        super().__init__({"kind": "cosine", "T_max": T_max, "eta_min": float(eta_min)})


class LinearLR(Schedule):
    """A linear warmup (or decay): the factor goes from `start_factor` to `end_factor` over `total_iters` steps."""

    def __init__(self, start_factor: float = 1.0 / 3, end_factor: float = 1.0, total_iters: int = 5) -> None:
        super().__init__({"kind": "linear", "start_factor": float(start_factor), "end_factor": float(end_factor),
                          "total_iters": total_iters})


class SequentialLR(Schedule):
    """`schedules` in turn, the next one starting (from its own step 0) at each of `milestones`."""

    def __init__(self, schedules: Sequence[Schedule], milestones: Sequence[int]) -> None:
        if not all(isinstance(s, Schedule) for s in schedules):
            raise TypeError(f"SequentialLR takes schedules of ravdl.v2.lr_schedules, not {schedules!r}")
        super().__init__({"kind": "sequential", "schedules": [s.spec for s in schedules],
                          "milestones": list(milestones)})


def schedule_spec(lr_schedule: Optional[Schedule]) -> Optional[dict[str, Any]]:
    """The JSON spec of an optimizer's `lr_schedule` argument (None or a Schedule), else TypeError."""
    if lr_schedule is None:
        return None
    if not isinstance(lr_schedule, Schedule):
        raise TypeError(f"lr_schedule takes a schedule of ravdl.v2.lr_schedules (StepLR, ExponentialLR, "
                        f"CosineAnnealingLR, LinearLR, SequentialLR) or None, not {lr_schedule!r}")
    return lr_schedule.spec
