"""Run the examples at their default length and write the two tables of examples (docs/users/examples.md) from
what they print.

Each script runs as a user runs it (a subprocess on the embedded default, no epoch override, its files in a
temporary folder); its figures are read from its output with the patterns below, with its wall time and the
machine's load average (1 minute) before and after, into docs/examples_results.json. The tables of
docs/users/examples.md between the `<!-- examples:begin -->`/`<!-- examples:end -->` and
`<!-- original-examples:... -->` markers are rendered from that file, so a figure there is always one a script
printed (tests/project/test_readme_examples.py checks that the page matches the file; the README links to the page).

    python scripts/readme_examples.py                      # run every example, rewrite the page
    python scripts/readme_examples.py gpt_sort.py ...      # run these again, keep the others' results
    python scripts/readme_examples.py --render             # rewrite the page from the results file only
    python scripts/readme_examples.py --check              # exit 1 if the page differs from the results
"""
import argparse
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from generated_files import write_or_check   # scripts/, the running script's folder

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "users" / "examples.md"   # the tables' page (the README links to it)
RESULTS = ROOT / "docs" / "examples_results.json"

ACCURACY = r"^test accuracy: ([0-9.]+)$"
SORTED = r"^held-out sequences sorted: ([0-9.]+)$"


def _g4(value):
    return f"{float(value):.4g}"


# script -> (what it shows, [(label, pattern whose group 1 is the figure, format or None)])
EXAMPLES = {
    "arithmetic.py": ("the README's first example, plus a 500x500 Gram matrix computed on a worker",
                      [("c_output:", r"^c_output: (tensor\(\[[-0-9, ]*\]\))$", "`c_output: {}`")]),
    "linear_regression.py": ("gradient descent by raw ops, as the original Ravop's linear-regression script did, "
                             "compared with numpy",
                             [("r2", r"^r2_score: ([-0-9.e]+)$", _g4),
                              ("max \\|theta - numpy\\|", r"max \|theta - numpy\| = ([-0-9.e]+)$", _g4)]),
    "iris_sequential.py": ("the original RavDL iris ANN script (Dense, BatchNorm, Dropout, softmax; Adam, square "
                           "loss), 100 epochs", [("test accuracy", ACCURACY, None)]),
    "iris_functional.py": ("the iris ANN as a Functional model of CustomLayers trained by an explicit loop of "
                           "`_forward_pass`/`_backward_pass`, 100 epochs",
                           [("test accuracy", ACCURACY, None)]),
    "digits_cnn_sequential.py": ("sklearn digits CNN, 15 epochs; the saved model fetched as a torch module",
                                 [("test accuracy", ACCURACY, None),
                                  ("saved module", r"^saved model's test accuracy: ([0-9.]+)$", None)]),
    "digits_cnn_functional.py": ("the same CNN as a Functional model of two convolution blocks "
                                 "(CustomLayers), trained by an explicit loop, 15 epochs",
                                 [("test accuracy", ACCURACY, None)]),
    "digits_torchscript.py": ("the digits CNN as a TorchScript file through `Pytorch_Model`, 15 epochs",
                              [("test accuracy", ACCURACY, None),
                               ("fetched module", r"^saved model's test accuracy: ([0-9.]+)$", None)]),
    "gpt_sort.py": ("a small GPT (Embedding, LayerNormalization, Dense, ops) that learns to sort tokens, "
                    "200 steps (a hand-written loop, folded by the compiler)",
                    [("held-out sequences sorted", SORTED, None)]),
    "parallel_training.py": ("a digits MLP trained with LocalSGD, DataParallel, Gossip and DiLoCo on the two "
                             "embedded workers, 20 epochs each",
                             [(f"{name}", rf"^{name} test accuracy: ([0-9.]+)$", None)
                              for name in ("LocalSGD", "DataParallel", "Gossip", "DiLoCo")]),
    "federated_analytics.py": ("federated mean, variance and std of two providers' CSVs (embedded default, "
                               "`data=`), compared with numpy",
                               [("max \\|federated - numpy\\|", r"^max \|federated - numpy\| = ([-0-9.e]+)$", None)]),
    "federated_analytics_private.py": ("federated median (KLL sketches), a k-anonymous histogram, a secure "
                                       "mean and std, and a differentially private mean of two clinics' providers",
                                       [("max rank error of the median", r"^max rank error = ([0-9.]+)$", None)]),
}

# script -> (what it is, [(label, pattern, format)], the project's example to compare with)
ORIGINALS = {
    "original_ann_functional.py": ("iris, 100 epochs", [("test accuracy", ACCURACY, None)], "iris_functional.py"),
    "original_ann_sequential.py": ("iris, 100 epochs, pickle + ONNX", [("test accuracy", ACCURACY, None)],
                                   "iris_sequential.py"),
    "original_cnn.py": ("digits CNN, 15 epochs, no shuffling as the original", [("test accuracy", ACCURACY, None)],
                        "digits_cnn_sequential.py"),
    "original_cnn_torchscript.py": ("15 epochs, square loss as the original",
                                    [("test accuracy", ACCURACY, None),
                                     ("fetched module", r"^accuracy of loaded model: ([0-9.]+)$", None)],
                                    "digits_torchscript.py"),
    "original_gpt_sorter.py": ("layers and math layers, 25 epochs = 225 steps",
                               [("held-out sequences sorted by generation", SORTED, None)], "gpt_sort.py"),
    "original_mingpt_sorter.py": ("minGPT TorchScript, 25 epochs = 225 steps, no dropout",
                                  [("held-out sequences sorted by generation", SORTED, None)], "gpt_sort.py"),
}
TIMEOUT = 3600   # seconds for one script: the original GPT sorter takes ~10 minutes on a loaded 2-core VM


def run(script):
    """{"figures": [text per pattern], "seconds", "load": [before, after], "date"} of one default run."""
    patterns = (EXAMPLES.get(script) or ORIGINALS[script])[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RAVDL_EPOCHS", "RAVOP_REDIS_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with tempfile.TemporaryDirectory(prefix="readme-example-") as folder:
        env["RAVOP_EXAMPLES_OUTPUT"] = folder
        load_before, started = os.getloadavg()[0], time.perf_counter()
        done = subprocess.run([sys.executable, str(ROOT / "examples" / script)], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)
        seconds, load_after = time.perf_counter() - started, os.getloadavg()[0]
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    figures = []
    for label, pattern, form in patterns:
        found = re.findall(pattern, done.stdout, flags=re.MULTILINE)
        if not found:
            raise RuntimeError(f"{script} printed no {label!r} (pattern {pattern}):\n{done.stdout[-2000:]}")
        value = found[-1]
        figures.append(form.format(value) if isinstance(form, str) else form(value) if form else value)
    return {"figures": figures, "seconds": round(seconds, 1), "load": [round(load_before, 1), round(load_after, 1)],
            "date": datetime.date.today().isoformat()}


def _figures(patterns, result):
    return ", ".join(text if label.endswith(":") else f"{label} {text}"
                     for (label, _, _), text in zip(patterns, result["figures"]))


def _timing(result):
    before, after = result["load"]
    return f"{result['seconds']:.1f} s (load {before:g}-{after:g})" if before != after else \
        f"{result['seconds']:.1f} s (load {before:g})"


def render_examples(results):
    rows = ["| script | what | full run (default length; wall time, machine load) |", "|---|---|---|"]
    for script, (what, patterns) in EXAMPLES.items():
        result = results[script]
        rows.append(f"| `examples/{script}` | {what} | {_figures(patterns, result)}, {_timing(result)} |")
    return "\n".join(rows)


def render_originals(results):
    rows = ["| script | full run (wall time, machine load) | the example's figure |", "|---|---|---|"]
    for script, (what, patterns, example) in ORIGINALS.items():
        result, theirs = results[script], results[example]
        rows.append(f"| `examples/{script}` ({what}) | {_figures(patterns, result)}, {_timing(result)} | "
                    f"{theirs['figures'][0]} (`{example}`) |")
    return "\n".join(rows)


TABLES = {"examples": render_examples, "original-examples": render_originals}


def render(page, results):
    """`page` with each table between its markers rendered from `results`."""
    for marker, render_table in TABLES.items():
        begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
        if page.count(begin) != 1 or page.count(end) != 1:
            raise ValueError(f"{PAGE.relative_to(ROOT)} needs one {begin} and one {end}")
        head, rest = page.split(begin)
        _, tail = rest.split(end)
        page = f"{head}{begin}\n{render_table(results)}\n{end}{tail}"
    return page


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scripts", nargs="*", help="run only these (file names in examples/)")
    parser.add_argument("--render", action="store_true", help="rewrite the page from the results file only")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from the results")
    args = parser.parse_args()
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not (args.render or args.check):
        for script in args.scripts or [*EXAMPLES, *ORIGINALS]:
            if script not in EXAMPLES and script not in ORIGINALS:
                parser.error(f"{script} is not a script of the tables: {', '.join([*EXAMPLES, *ORIGINALS])}")
            print(f"running examples/{script} ...", flush=True)
            results[script] = run(script)
            print(f"  {results[script]}", flush=True)
            RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")   # kept if a later one fails
    return write_or_check(PAGE, render(PAGE.read_text(), results), args.check,
                          "python scripts/readme_examples.py --render (its tables of examples)")


if __name__ == "__main__":
    raise SystemExit(main())
