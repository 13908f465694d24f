"""docs/walkthrough.py runs as a reader runs it (a subprocess, from the repository root): it records a tiny fit,
prints the compiled plan, evaluates the graph in process and prints the losses, which fall."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_walkthrough_runs_and_prints_the_plan_and_the_losses():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "docs/walkthrough.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"^subgraph \d+: 1 ops \['loop'\]", done.stdout, re.M), done.stdout
    assert re.search(r"^  loop template: \d+ ops", done.stdout, re.M), done.stdout
    losses = [float(x) for x in re.search(r"^losses: (.+)$", done.stdout, re.M).group(1).split()]
    assert len(losses) == 16 and all(0 < loss < 5 for loss in losses), losses
    assert sum(losses[-4:]) < sum(losses[:4]), losses   # it learns
