"""Pipeline (GPipe): the model's layers cut into `stages` contiguous stages of balanced cost, every batch into
`micro_batches` micro-batches (as torch.tensor_split cuts it). Each (stage, micro-batch) forward is a subgraph of
its own, as is each backward, which recomputes its stage's forward from the stage's input (GPipe's
re-materialisation) and hands the gradient of that input to the stage before it; the optimizer steps once on the
micro-batches' gradients weighted by their sizes: the same mathematics as one worker. Ready subgraphs go to idle
workers, so stage s of micro-batch m+1 runs while stage s+1 works on micro-batch m.

`replicas=R` composes it with data parallelism (Ravnest's clusters, averaged every step): every batch is first
cut into R replica slices, each slice into `micro_batches`, and the gradients of all of them are averaged before
the one optimizer step. Since the micro-batches of one stage never wait for each other, this is the same graph
as R * micro_batches micro-batches cut that way; what it adds is the placement of R copies of the stages."""
from .data_parallel import tensor_split
from .replicas import check_replicas


class Pipeline:
    """`stages`: a number, or 'auto': the fewest stages of which each fits the smallest subgraph memory limit
    the live workers advertise (`fit` resolves it when it records, see `fewest_stages`)."""

    def __init__(self, stages, micro_batches=1, replicas=1):
        if stages != "auto" and (type(stages) is not int or stages < 1):
            raise ValueError(f"stages must be a positive int or 'auto', not {stages!r}")
        if type(micro_batches) is not int or micro_batches < 1:
            raise ValueError(f"micro_batches must be a positive int, not {micro_batches!r}")
        self.stages, self.micro_batches, self.replicas = stages, micro_batches, check_replicas(replicas)

    def record_fit(self, fit):
        return fit.pipeline(self)

    def roles(self):
        """'stage s', or 'replica r stage s' with replicas; before 'auto' is resolved, its replicas."""
        if self.stages == "auto":
            return [f"replica {r}" for r in range(self.replicas)]
        if self.replicas == 1:
            return [f"stage {s}" for s in range(self.stages)]
        return [f"replica {r} stage {s}" for r in range(self.replicas) for s in range(self.stages)]

    def fewest_stages(self, costs, limit):
        """This pipeline with the fewest stages whose largest stage cost (`costs` per layer, in bytes) is at most
        `limit`; ValueError when even one layer per stage is over it."""
        for stages in range(1, len(costs) + 1):
            candidate = Pipeline(stages, self.micro_batches, self.replicas)
            if max(sum(costs[start:stop]) for start, stop in candidate.cut(costs)) <= limit:
                return candidate
        raise ValueError(f"Pipeline(stages='auto'): a layer needs about {max(costs):,} bytes, over the smallest "
                         f"subgraph memory limit of the live workers ({limit:,} bytes); give workers more memory "
                         f"(ravop-worker --max-memory)")

    def cut(self, costs):
        """(start, stop) of each stage over layers of `costs`: contiguous, the largest stage cost the least
        possible (ties: earlier cuts)."""
        if self.stages == "auto":
            raise ValueError("Pipeline(stages='auto') has no cut until its number of stages is chosen "
                             "(fewest_stages)")
        n = len(costs)
        if n < self.stages:
            raise ValueError(f"{n} layers cannot make {self.stages} stages: use at most {n}")
        prefix = [0]
        for c in costs:
            prefix.append(prefix[-1] + c)
        best = {}   # (first layer, stages left) -> (largest stage cost, cuts)

        def solve(start, left):
            if left == 1:
                return prefix[n] - prefix[start], [(start, n)]
            if (start, left) not in best:
                options = []
                for stop in range(start + 1, n - left + 2):
                    rest, cuts = solve(stop, left - 1)
                    options.append((max(prefix[stop] - prefix[start], rest), [(start, stop)] + cuts))
                best[start, left] = min(options, key=lambda option: option[0])
            return best[start, left]
        return solve(0, self.stages)[1]

    def micro_slices(self, rows):
        """(start, stop) of each micro-batch of a batch of `rows` rows, replica by replica."""
        return [(first + start, first + stop)
                for first, last in tensor_split(rows, self.replicas, "replica slices")
                for start, stop in tensor_split(last - first, self.micro_batches, "micro-batches")]

    def __repr__(self):
        replicas = f", replicas={self.replicas}" if self.replicas > 1 else ""
        return f"Pipeline(stages={self.stages}, micro_batches={self.micro_batches}{replicas})"
