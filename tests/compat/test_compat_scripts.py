"""Issue 11: the requester scripts written in the original style (examples/original_*.py) run unchanged as a
user runs them (a subprocess, the embedded default), on reduced epochs that still reach the accuracy of this
project's own examples; full-length figures are in
docs/users/examples.md."""
import re

import pytest

from example_runs import run_example

# script -> (reduced epochs, printed metric, threshold the reduced run must reach)
SCRIPTS = {
    "original_ann_functional.py": (20, "test accuracy", 0.9),
    "original_ann_sequential.py": (20, "test accuracy", 0.9),
    "original_cnn.py": (5, "test accuracy", 0.9),
    "original_cnn_torchscript.py": (5, "test accuracy", 0.9),
    "original_gpt_sorter.py": (16, "held-out sequences sorted", 0.9),   # 12 epochs: 0.84-1.0 by seed
    "original_mingpt_sorter.py": (10, "held-out sequences sorted", 0.95),
}


# the scripts that write files -> the files, and how the folder is given: its second argument, else
# $RAVOP_EXAMPLES_OUTPUT (examples/example_data.py's output_dir); each prints the folder it writes to
WRITES = {"original_ann_sequential.py": ({"model.pkl", "test_ann.onnx"}, "argument"),
          "original_cnn_torchscript.py": ({"test_model.pt"}, "environment"),
          "original_mingpt_sorter.py": ({"sorter_gpt.pt"}, "environment")}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_original_style_script_reaches_its_metric(script, tmp_path):
    """...and writes its files into the folder it is given and prints, none in its working directory or the
    checkout (example_runs.run_example)."""
    epochs, metric, threshold = SCRIPTS[script]
    files, given_by = WRITES.get(script, (set(), "argument"))
    out = tmp_path / "out"
    if given_by == "argument":
        stdout = run_example(script, args=(str(epochs), str(out)), timeout=900)
    else:
        stdout = run_example(script, args=(str(epochs),), env={"RAVOP_EXAMPLES_OUTPUT": str(out)}, timeout=900)
    found = re.findall(rf"^{metric}: ([0-9.]+)$", stdout, flags=re.MULTILINE)
    assert found and float(found[0]) >= threshold, stdout[-2000:]
    if script == "original_cnn_torchscript.py":   # the fetched TorchScript module agrees with the graph
        assert re.search(rf"^accuracy of loaded model: {found[0]}$", stdout, flags=re.MULTILINE)
    if files:   # original_ann_sequential.py: pickled, reloaded and exported
        assert f"writing files to {out}" in stdout.splitlines()
        assert files <= {path.name for path in out.iterdir()}
