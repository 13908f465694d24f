"""DataParallel: every batch is cut into `replicas` slices (as torch.tensor_split cuts it); each replica computes
the gradient of its slice's loss, and the optimizer steps once on their mean weighted by slice sizes, which for a
mean-reduced loss is the whole batch's gradient: the same mathematics as one worker."""
from .replicas import check_replicas


class DataParallel:
    def __init__(self, replicas):
        self.replicas = check_replicas(replicas)

    def slices(self, rows):
        """(start, stop) of each replica's rows of a batch of `rows` rows."""
        base, extra = divmod(rows, self.replicas)
        bounds, start = [], 0
        for r in range(self.replicas):
            stop = start + base + (r < extra)
            bounds.append((start, stop))
            start = stop
        if any(start == stop for start, stop in bounds):
            raise ValueError(f"a batch of {rows} rows cannot be cut into {self.replicas} non-empty slices: use a "
                             "batch_size of at least the number of replicas")
        return bounds

    def __repr__(self):
        return f"DataParallel(replicas={self.replicas})"
