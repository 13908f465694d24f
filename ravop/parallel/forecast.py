"""A forecast of which live worker takes which replica (or pipeline stage) of a strategy, for R.activate()'s
summary. It is not placement: the engine hands every ready subgraph to whichever idle worker of the graph's
device kind reads the stream first, so the replicas of one synchronisation interval run on distinct workers
whenever that many are idle, but which one takes which is up to them. The forecast ranks the workers that
serve the graph's device kind (`ravop.store.worker_info`'s "kind": 'cpu' or 'cuda') by what a replica needs
(the speed of a tensor hand-off through the store, measured at start by worker/serve/calibrate.py, for the
synchronisations; then threads and memory) and deals the strategy's roles out in that order, sharing workers
when there are fewer."""


def _rank(worker):
    return (-float(worker.get("handoff_bytes_per_s") or 0), -int(worker.get("threads") or 0),
            -int(worker.get("memory_limit") or 0), worker["name"])


def rank_workers(workers):
    """`workers` in the order the forecast deals roles to them."""
    return sorted(workers, key=_rank)


def forecast(strategy, workers, device_kind):
    """{role ('replica r', 'stage s', 'replica r stage s'): worker name} for `strategy` over the `workers`
    (ravop.store.worker_info.read_all's dicts) of `device_kind` ('cpu' or 'cuda', the graph's: a CUDA worker
    never takes a CPU graph's subgraphs); an empty dict without such workers."""
    ranked = rank_workers(w for w in workers if w.get("kind") == device_kind)
    return {role: ranked[k % len(ranked)]["name"] for k, role in enumerate(strategy.roles())} if ranked else {}
