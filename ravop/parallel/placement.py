"""Where a strategy's replicas run, from what the workers advertise (`ravop.store.worker_info`: device, memory,
threads, the measured speed of their link to the store). The engine hands every ready subgraph to whichever
idle worker reads the stream first, so the replicas of one synchronisation interval run on distinct workers
whenever that many are idle; this ranks the live workers by what a replica needs (link speed for the averaging,
then threads and memory) and says which replica each would take, sharing workers when there are fewer."""


def _rank(worker):
    return (-float(worker.get("link_bytes_per_s") or 0), -int(worker.get("threads") or 0),
            -int(worker.get("memory_limit") or 0), worker["name"])


def placement(replicas, workers):
    """{'replica r': worker name} for `replicas` replicas over `workers` (ravop.store.worker_info.read_all's
    dicts); an empty dict without workers."""
    ranked = sorted(workers, key=_rank)
    if not ranked:
        return {}
    return {f"replica {r}": ranked[r % len(ranked)]["name"] for r in range(replicas)}


def describe(workers):
    """One line per worker: its advertised capabilities."""
    lines = []
    for w in sorted(workers, key=_rank):
        speed = w.get("link_bytes_per_s")
        link = f"{float(speed) / 1e6:.0f} MB/s to the store" if speed else "link not measured"
        lines.append(f"{w['name']}: {w.get('device', '?')}, {w.get('threads', '?')} threads, "
                     f"{w.get('memory_limit', '?')} bytes, {link}")
    return lines
