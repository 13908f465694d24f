"""Pipeline (GPipe-style stages): not built yet. It is named here so scripts that ask for it fail at once with
what is missing, rather than training some other way."""


class Pipeline:
    def __init__(self, stages, micro_batches=1):
        raise NotImplementedError(
            "R.parallel.Pipeline is not implemented yet: cutting a step's layers into stages with activations and "
            "gradients passed between workers per micro-batch needs a stage-partitioning compiler pass; use "
            "DataParallel or LocalSGD meanwhile")
