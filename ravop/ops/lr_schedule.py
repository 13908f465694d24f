"""Learning-rate schedules evaluated inside an optimizer step op from its step counter, so a training loop's
schedule costs nothing in the plan (the step template is the same at every step; the worker's step counter
advances). A schedule is plain JSON in the op's params (it crosses the wire: every field is checked):

    {"kind": "step", "step_size": 30, "gamma": 0.1}         # torch.optim.lr_scheduler.StepLR
    {"kind": "exponential", "gamma": 0.99}                   # ExponentialLR
    {"kind": "cosine", "T_max": 100, "eta_min": 0.0}         # CosineAnnealingLR (its closed form)
    {"kind": "linear", "start_factor": 0.1, "end_factor": 1.0, "total_iters": 10}   # LinearLR (warmup)
    {"kind": "sequential", "schedules": [...], "milestones": [10]}                 # SequentialLR

The value at optimizer step t (1-based, as the step ops count) is torch's after t - 1 calls of
`scheduler.step()`, one after each `optimizer.step()`: the schedule is per step, not per epoch."""
import math

KINDS = {"step": {"step_size": int, "gamma": float}, "exponential": {"gamma": float},
         "cosine": {"T_max": int, "eta_min": float},
         "linear": {"start_factor": float, "end_factor": float, "total_iters": int},
         "sequential": {"schedules": list, "milestones": list}}
MAX_DEPTH = 4   # sequential schedules nest at most this deep


def _as_dict(schedule):
    """A schedule as a dict: a recorded op keeps a dict param as its sorted (key, value) pairs."""
    if isinstance(schedule, (list, tuple)) and all(isinstance(pair, (list, tuple)) and len(pair) == 2 and
                                                   isinstance(pair[0], str) for pair in schedule):
        return dict(schedule)
    return schedule


def check_schedule(schedule, depth=0):
    """`schedule` as a dict if it is None or a well-formed schedule (see the module docstring, or its
    (key, value) pairs), else ValueError."""
    if schedule is None and depth == 0:
        return None
    schedule = _as_dict(schedule)
    if not isinstance(schedule, dict) or schedule.get("kind") not in KINDS or depth > MAX_DEPTH:
        raise ValueError(f"lr_schedule must be one of {sorted(KINDS)} as a dict with 'kind', not {schedule!r}")
    fields = KINDS[schedule["kind"]]
    if set(schedule) != {"kind", *fields}:
        raise ValueError(f"a {schedule['kind']!r} lr_schedule has the fields {sorted(fields)}, not "
                         f"{sorted(set(schedule) - {'kind'})}")
    for name, kind in fields.items():
        value = schedule[name]
        ok = (type(value) is int and value >= 1) if kind is int else \
            (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
             and value >= 0) if kind is float else isinstance(value, (list, tuple))
        if not ok:
            raise ValueError(f"lr_schedule field {name!r} must be a {'positive int' if kind is int else kind.__name__}"
                             f"{' >= 0' if kind is float else ''}, not {value!r}")
    if schedule["kind"] == "sequential":
        parts, milestones = schedule["schedules"], schedule["milestones"]
        if not parts or len(milestones) != len(parts) - 1 or any(type(m) is not int or m < 1 for m in milestones) \
                or list(milestones) != sorted(milestones):
            raise ValueError(f"a sequential lr_schedule needs n schedules and n - 1 increasing positive milestones, "
                             f"not {len(parts)} and {milestones!r}")
        schedule = {**schedule, "schedules": [check_schedule(part, depth + 1) for part in parts]}
    return schedule


def scheduled_lr(lr, schedule, step):
    """The learning rate of optimizer step `step` (1-based) from base `lr`."""
    if schedule is None:
        return lr
    return _lr(lr, check_schedule(schedule), max(int(step) - 1, 0))


def _lr(lr, schedule, epoch):
    """The closed form of torch's scheduler after `epoch` steps."""
    kind = schedule["kind"]
    if kind == "step":
        return lr * schedule["gamma"] ** (epoch // schedule["step_size"])
    if kind == "exponential":
        return lr * schedule["gamma"] ** epoch
    if kind == "linear":
        start, end, total = schedule["start_factor"], schedule["end_factor"], schedule["total_iters"]
        return lr * (start + (end - start) * min(epoch, total) / total)
    if kind == "cosine":
        eta_min, t_max = schedule["eta_min"], schedule["T_max"]
        return eta_min + (lr - eta_min) * (1 + math.cos(math.pi * epoch / t_max)) / 2
    at = 0   # sequential: each schedule counts from its milestone, as SequentialLR restarts it
    for part, milestone in zip(schedule["schedules"], schedule["milestones"]):
        if epoch < milestone:
            return _lr(lr, part, epoch - at)
        at = milestone
    return _lr(lr, schedule["schedules"][-1], epoch - at)
