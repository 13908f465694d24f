"""What every replicated strategy shares: the replica count, its check, and averaging recorded as ops."""


def check_replicas(replicas):
    if type(replicas) is not int or replicas < 1:
        raise ValueError(f"replicas must be a positive int, not {replicas!r}")
    return replicas


def weighted_sum(values, weights):
    """sum(w * v), recorded as ops; weights of 1.0 skip their multiplication."""
    total = None
    for value, weight in zip(values, weights):
        term = value if weight == 1.0 else value * float(weight)
        total = term if total is None else total + term
    return total


def average(values):
    """The mean of `values` (Ops of one shape), as torch.stack(values).mean(0) computes it for two."""
    return values[0] if len(values) == 1 else weighted_sum(values, [1.0] * len(values)) * (1.0 / len(values))
