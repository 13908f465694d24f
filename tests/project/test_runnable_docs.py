"""The docs' code runs as a reader runs it (a subprocess): docs/walkthrough.py records a tiny fit, prints the
compiled plan, evaluates the graph in process and prints the losses, which fall; the README's first model trains on
the embedded default and prints its History's losses."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "RAVOP_REDIS_URL"}   # the README's model: embedded default
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_walkthrough_runs_and_prints_the_plan_and_the_losses():
    done = run(["docs/walkthrough.py"], ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"^subgraph \d+: \d+ ops \['loop'(, 'tuple_get')*\]", done.stdout, re.M), done.stdout
    assert re.search(r"^  loop template: \d+ ops", done.stdout, re.M), done.stdout
    losses = [float(x) for x in re.search(r"^losses: (.+)$", done.stdout, re.M).group(1).split()]
    assert len(losses) == 16 and all(0 < loss < 5 for loss in losses), losses
    assert sum(losses[-4:]) < sum(losses[:4]), losses   # it learns


def test_the_readmes_first_model_trains(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    model = next(block for block in blocks if "NeuralNetwork" in block)
    done = run(["-c", model], tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    losses = [float(x) for x in re.search(r"^\[(.+)\]$", done.stdout, re.M).group(1).split(", ")]
    assert len(losses) == 5 and losses[-1] < losses[0], losses
    assert "tensor(" in done.stdout
