"""Where a strategy's replicas run, from what the workers advertise (`ravop.store.worker_info`: device, memory,
threads, the speed of a tensor hand-off through the store that each measures at start, worker/calibrate.py). The engine hands every ready subgraph to whichever
idle worker reads the stream first, so the replicas of one synchronisation interval run on distinct workers
whenever that many are idle (a pipeline's stages likewise); this ranks the live workers by what a replica needs
(link speed for the averaging, then threads and memory) and says which replica or stage each would take, sharing
workers when there are fewer."""


def _rank(worker):
    return (-float(worker.get("handoff_bytes_per_s") or 0), -int(worker.get("threads") or 0),
            -int(worker.get("memory_limit") or 0), worker["name"])


def placement(strategy, workers):
    """{'replica r', 'stage s' or 'replica r stage s': worker name} for `strategy` over `workers` (ravop.store.worker_info.read_all's
    dicts); an empty dict without workers."""
    ranked = sorted(workers, key=_rank)
    stages = getattr(strategy, "stages", None)
    if not stages:
        roles = [f"replica {r}" for r in range(strategy.replicas)]
    elif strategy.replicas == 1:
        roles = [f"stage {s}" for s in range(stages)]
    else:
        roles = [f"replica {r} stage {s}" for r in range(strategy.replicas) for s in range(stages)]
    return {role: ranked[k % len(ranked)]["name"] for k, role in enumerate(roles)} if ranked else {}

