"""How many torch threads a process on this machine runs, so that workers sharing its cores never
oversubscribe them: N workers on C cores run C // N intra-op threads each (at least 1).

OpenMP's threads wait for work by spinning by default; when the cores are shared with anything else (another
worker, the user's own job) a spinning thread holds a core that the thread it waits for needs, and small
kernels slow down many times over. Worker processes therefore wait passively (OMP_WAIT_POLICY=PASSIVE, read
by the OpenMP runtime when torch loads it) unless the environment says otherwise: measured on 2 shared cores,
a loop of small matmuls on 2 threads beside one busy process took 2.14 s spinning and 0.38 s passive, and the
same on a quiet machine (0.42 / 0.39 s); see docs/developers/performance.md.
"""
import os
from typing import MutableMapping

WAIT_POLICY = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's share), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def per_worker(workers: int, cores: int = 0) -> int:
    """Intra-op threads for each of `workers` processes sharing `cores` (default: this machine's)."""
    return max(1, (cores or machine_cores()) // max(1, workers))


def passive_waiting(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """`env` with OpenMP told to wait passively, unless it already says how to wait."""
    env.setdefault(WAIT_POLICY, PASSIVE)
    return env
