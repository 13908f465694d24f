"""Many requesters at once: 8 processes, each with its own token and graph, against one server and two
workers; every one finishes with its own exact result."""
import os
import subprocess
import sys
from pathlib import Path

import torch

from helpers import on_one_thread

ROOT = str(Path(__file__).resolve().parents[2])

REQUESTER = """
import sys, torch, ravop as R
index, url = int(sys.argv[1]), sys.argv[2]
R.initialize(token=f"crowd-{index}", redis_url=url)
R.flush()
R.Graph(name=f"crowd-{index}")
x = R.t(torch.full((200, 200), float(index + 1)))
y = R.tanh(x @ x / 1e4) * (index + 1)
y.sum().persist_op("total")
assert R.activate()["subgraphs"] >= 1, "folded at activate: nothing would run on the workers"
R.execute()
R.track_progress(progress_bar=False, timeout=300)
print(repr(float(R.fetch_persisting_op("total"))))
R.flush()
"""


def expected(index):
    """What requester `index` computes, on one thread as the test workers run (bit for bit)."""
    x = torch.full((200, 200), float(index + 1))
    return float(on_one_thread(lambda: (torch.tanh(x @ x / 1e4) * (index + 1)).sum()))


def test_eight_requesters_at_once(server, workers):
    workers.start(2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    procs = [subprocess.Popen([sys.executable, "-c", REQUESTER, str(i), server.url], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(8)]
    results = [proc.communicate(timeout=600) for proc in procs]
    for index, (proc, (out, err)) in enumerate(zip(procs, results)):
        assert proc.returncode == 0, f"requester {index}: {err[-2000:]}"
        assert float(out.strip().splitlines()[-1]) == expected(index), (index, out)
