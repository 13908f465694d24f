"""Pipeline (GPipe): the model's units (NeuralNetwork's top-level layers, a Functional's chain of layers, a
Pytorch_Model's top-level children or pieces of its traced graph: ravdl/v2/pipeline_stages.py) cut into `stages`
contiguous stages of balanced memory, every batch into `micro_batches` micro-batches (as torch.tensor_split cuts
it). Each (stage, micro-batch) forward is a subgraph of its own, as is each backward, which recomputes its stage's
forward from the stage's input (GPipe's re-materialisation) and hands the gradient of that input to the stage before
it; the optimizer steps once on the micro-batches' gradients weighted by their sizes: the same mathematics as one
worker. Ready subgraphs go to idle workers, so stage s of micro-batch m+1 runs while stage s+1 works on micro-batch
m.

`replicas=R` composes it with data parallelism (Ravnest's clusters, averaged every step): every batch is first
cut into R replica slices, each slice into `micro_batches`, and the gradients of all of them are averaged before
the one optimizer step. Since the micro-batches of one stage never wait for each other, this is the same graph
as R * micro_batches micro-batches cut that way; what it adds is the placement of R copies of the stages.

`resident` (None: when the batch size divides the rows, there are no replicas and the session's live workers can
hold every stage at once; True; False): each stage is one loop op for the whole fit, its parameters and optimizer
state kept by the worker that runs it, only activations and their gradients crossing the store
(ravdl/v2/pipeline_resident.py); otherwise every (stage, micro-batch) forward and backward is a one-step segment."""
from ..runtime.runner import op_seed, step_seed
from .data_parallel import tensor_split
from .forecast import rank_workers
from .replicas import check_replicas, check_resident

_STAGE_STREAMS = 0x5A6E   # keeps the stages' seeds apart from the graph's op streams


def stage_stream(graph_seed, micro_batch, stage, k=0):
    """The seed naming the stream of the `k`-th random stream (a ravdl stage's k-th top-level Dropout; a TorchScript
    stage has one) of `stage`'s forward of `micro_batch`, over the training steps: a resident stage's loop records
    it under `Step.seed_by_step` (ravop.record.loop), so its `forward m` and `backward m` templates draw
    `stage_seed`."""
    return op_seed(op_seed(op_seed(op_seed(graph_seed, _STAGE_STREAMS), micro_batch), stage), k)


def stage_seed(graph_seed, step, micro_batch, stage, k=0):
    """The seed of that stream at training `step` (0-based): the forward of the micro-batch and the recompute of
    its backward both draw from it, so they use the same masks (a sync template runs after `step + 1` training
    steps: `step_seed` of those)."""
    return step_seed(stage_stream(graph_seed, micro_batch, stage, k), step + 1)


class Pipeline:
    """`stages`: a number, or 'auto': the fewest stages of which each fits the subgraph memory limit of the live
    worker it goes to, cut where the least crosses (`fit` resolves it when it records, see `fit_to_workers`)."""

    def __init__(self, stages, micro_batches=1, replicas=1, resident=None):
        if stages != "auto" and (type(stages) is not int or stages < 1):
            raise ValueError(f"stages must be a positive int or 'auto', not {stages!r}")
        if type(micro_batches) is not int or micro_batches < 1:
            raise ValueError(f"micro_batches must be a positive int, not {micro_batches!r}")
        self.stages, self.micro_batches, self.replicas = stages, micro_batches, check_replicas(replicas)
        self.resident = check_resident(resident)
        self.planned = None   # the cut fit_to_workers chose, if it chose this pipeline

    def record_fit(self, fit):
        return fit.pipeline(self)

    def roles(self):
        """'stage s', or 'replica r stage s' with replicas; before 'auto' is resolved, its replicas."""
        if self.stages == "auto":
            return [f"replica {r}" for r in range(self.replicas)]
        if self.replicas == 1:
            return [f"stage {s}" for s in range(self.stages)]
        return [f"replica {r} stage {s}" for r in range(self.replicas) for s in range(self.stages)]

    def fit_to_workers(self, memory, boundary, workers):
        """This pipeline with the fewest stages that fit `workers` (ravop.store.worker_info dicts advertising
        "memory_limit"): stage s goes to the worker the summary's forecast deals it (`forecast`'s ranking, by the
        speed of a tensor hand-off through the store, then threads and memory), and must fit that worker's memory
        limit (with replicas, the least of the workers its copies go to); `memory` is each unit's measured bytes.
        Of the cuts that fit, the one whose stage boundaries move the fewest seconds of activations (each
        boundary's `boundary` bytes, forward and gradient back, at the slower of the two workers' hand-off speed)
        is taken, ties to the most even memory. ValueError when even one unit per stage does not fit."""
        ranked = rank_workers(workers)
        n = len(memory)
        prefix = [0]
        for c in memory:
            prefix.append(prefix[-1] + c)
        for stages in range(1, n + 1):
            roles = Pipeline(stages, self.micro_batches, self.replicas, self.resident)
            limit = [min(int(ranked[(r * stages + s) % len(ranked)]["memory_limit"]) for r in range(self.replicas))
                     for s in range(stages)]
            speed = [min(float(ranked[(r * stages + s) % len(ranked)].get("handoff_bytes_per_s") or 0) or 1.0
                         for r in range(self.replicas)) for s in range(stages)]
            best = {}

            def solve(start, s):
                """(transfer seconds, largest memory over limit) of the best cut of units [start, n) into stages
                s.., or None when none fits."""
                if s == stages - 1:
                    load = (prefix[n] - prefix[start]) / limit[s]
                    return (0.0, load, [(start, n)]) if load <= 1 else None
                if (start, s) not in best:
                    options = []
                    for stop in range(start + 1, n - (stages - s) + 2):
                        load = (prefix[stop] - prefix[start]) / limit[s]
                        rest = solve(stop, s + 1) if load <= 1 else None
                        if rest is not None:
                            seconds = 2 * boundary[stop - 1] / min(speed[s], speed[s + 1])
                            options.append((seconds + rest[0], max(load, rest[1]), [(start, stop)] + rest[2]))
                    best[start, s] = min(options, key=lambda o: o[:2]) if options else None
                return best[start, s]

            found = solve(0, 0)
            if found is not None:
                roles.planned = found[2]
                return roles
        raise ValueError(f"Pipeline(stages='auto'): a unit needs about {max(memory):,} bytes, over the memory "
                         f"limit of the live workers it could go to ({min(int(w['memory_limit']) for w in workers):,}"
                         " bytes at the least); give workers more memory (ravop-worker --max-memory)")

    def cut(self, costs):
        """(start, stop) of each stage over layers of `costs`: contiguous, the largest stage cost the least
        possible (ties: earlier cuts)."""
        if self.planned is not None:
            return self.planned
        if self.stages == "auto":
            raise ValueError("Pipeline(stages='auto') has no cut until its number of stages is chosen "
                             "(fit_to_workers)")
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
        resident = f", resident={self.resident}" if self.resident is not None else ""
        return f"Pipeline(stages={self.stages}, micro_batches={self.micro_batches}{replicas}{resident})"
