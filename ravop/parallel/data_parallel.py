"""DataParallel: every batch is cut into `replicas` slices (as torch.tensor_split cuts it); each replica computes
the gradient of its slice's loss, and the optimizer steps once on their mean weighted by slice sizes, which for a
mean-reduced loss is the whole batch's gradient: the same mathematics as one worker."""
from .replicas import check_replicas


class DataParallel:
    def __init__(self, replicas):
        self.replicas = check_replicas(replicas)

    def record_fit(self, fit):
        return fit.gradient_replicas(self)

    def roles(self):
        return [f"replica {r}" for r in range(self.replicas)]

    def slices(self, rows):
        """(start, stop) of each replica's rows of a batch of `rows` rows."""
        return tensor_split(rows, self.replicas, "replica slices")

    def __repr__(self):
        return f"DataParallel(replicas={self.replicas})"


def tensor_split(rows, parts, what):
    """(start, stop) of `parts` non-empty pieces of `rows` rows, as torch.tensor_split sizes them."""
    base, extra = divmod(rows, parts)
    if not base:
        raise ValueError(f"a batch of {rows} rows cannot be cut into {parts} non-empty {what}: use a batch_size "
                         f"of at least {parts}")
    bounds, start = [], 0
    for k in range(parts):
        stop = start + base + (k < extra)
        bounds.append((start, stop))
        start = stop
    return bounds
