"""The RavDL example scripts run as a user runs them (a subprocess, the embedded default engine), on reduced
epoch counts that still reach the issue's thresholds; full-length figures are in
docs/users/examples.md. Each run leaves no file behind (tests/example_runs.py), and every example is run by
a test."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from example_runs import ROOT, run_example

# script -> (reduced epochs or steps, printed metric, threshold the reduced run must reach)
EXAMPLES = {
    "iris_sequential.py": (20, "test accuracy", 0.9),
    "iris_functional.py": (20, "test accuracy", 0.9),
    "digits_cnn_sequential.py": (10, "test accuracy", 0.95),
    "digits_cnn_functional.py": (10, "test accuracy", 0.95),
    "gpt_sort.py": (100, "held-out sequences sorted", 0.9),
    "parallel_training.py": (3, "DiLoCo test accuracy", 0.8),   # after LocalSGD's, DataParallel's and Gossip's
}


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_reaches_its_metric(script):
    epochs, metric, threshold = EXAMPLES[script]
    out = run_example(script, epochs)
    found = re.findall(rf"^{metric}: ([0-9.]+)$", out, flags=re.MULTILINE)
    assert found, f"{script} printed no '{metric}':\n{out[-2000:]}"
    assert float(found[-1]) >= threshold, out[-2000:]


def test_main_example_prints_both_results():
    out = run_example("arithmetic.py", 1)
    assert "c_output: tensor([5, 7, 9])" in out
    gram = float(re.search(r"^gram_mean: tensor\(([-0-9.e]+)\)$", out, flags=re.MULTILINE).group(1))
    assert 0.2 < gram < 0.5   # E[(x x^T)_ij]: 500/3 on the diagonal, 0 elsewhere -> mean ~ 1/3


def test_linear_regression_example_matches_numpy():
    out = run_example("linear_regression.py", 1)
    difference = float(re.search(r"max \|theta - numpy\| = ([-0-9.e]+)$", out, flags=re.MULTILINE).group(1))
    assert difference < 1e-9


def test_the_examples_default_output_folder_is_ignored_by_git(monkeypatch):
    """Without a folder argument or $RAVOP_EXAMPLES_OUTPUT, examples/output/: in the checkout, ignored by git."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.setattr(sys, "argv", ["example.py"])
    monkeypatch.delenv("RAVOP_EXAMPLES_OUTPUT", raising=False)
    import example_data
    folder = Path(example_data.output_dir())
    assert folder == ROOT / "examples" / "output" and folder.is_dir()
    probe = folder / "probe.pt"
    done = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=ROOT)
    assert done.returncode == 0, "examples/output/ is not ignored by git"


HELPERS = {"example_data.py"}   # imported by the examples, not run


def test_every_example_is_run_by_a_test_that_checks_it_leaves_no_file():
    """A script under examples/ is named in a test file that runs examples through example_runs.run_example."""
    runners = [path.read_text() for path in (ROOT / "tests").rglob("test_*.py")
               if "from example_runs import" in path.read_text()]
    scripts = {path.name for path in (ROOT / "examples").glob("*.py")} - HELPERS
    unrun = sorted(script for script in scripts if not any(f'"{script}"' in text for text in runners))
    assert not unrun, f"examples no test runs through example_runs.run_example: {unrun}"
