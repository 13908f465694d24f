"""The core interfaces the loop path runs through are annotated and mypy accepts them: the registry and its
OpDef, Node, the runner and the loop runner, loop recording and its templates, the wire's pack/unpack, and the
worker's checks and runs. Every function there has annotations (--disallow-untyped-defs), and their bodies are
checked (--check-untyped-defs). So are whole packages (PACKAGES): the compiler, the worker (serving, execution, loops,
verification and data-provider sides), and ravdl.v2 (which, with the compiler, ships py.typed)."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORE = ["ravop/core/registry.py", "ravop/core/node.py", "ravop/runtime/runner.py", "ravop/runtime/loop_run.py",
        "ravop/core/loop_template.py", "ravop/record/loop.py", "ravop/runtime/evaluate.py", "ravop/wire/codec.py",
        "ravop/wire/nodes.py", "ravop/wire/loop_message.py", "worker/execute/run.py", "worker/execute/validate.py"]
# Every function of these annotated, bodies checked, and no `type: ignore` left that mypy no longer needs.
PACKAGES = ["compiler", "worker/serve", "worker/execute", "worker/loops", "worker/verify", "worker/provider", "ravdl/v2"]


def test_mypy_accepts_the_annotated_core(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), "--no-error-summary",
                           "--disallow-untyped-defs", "--check-untyped-defs", *CORE],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_accepts_the_annotated_packages(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), "--no-error-summary",
                           "--disallow-untyped-defs", "--disallow-incomplete-defs", "--check-untyped-defs",
                           "--warn-unused-ignores", *PACKAGES], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_rejects_a_wrong_use_of_ravdl(tmp_path):
    """ravdl's public classes are typed for a user's script: a misspelt keyword and a wrong argument are errors."""
    script = tmp_path / "wrong.py"
    script.write_text("from ravdl.v2 import NeuralNetwork\nfrom ravdl.v2.layers import Dense\n"
                      "from ravdl.v2.optimizers import Adam\n"
                      "model = NeuralNetwork(Adam(lr=0.01), loss='SquareLoss')\nmodel.add(Dense(4, use_bias=True))\n"
                      "model.add(Adam())\nmodel.fit([[1.0]], [[1.0]], epochs=2)\n")
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary",
                           str(script)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout
    assert 'Argument 1 to "add" of "NeuralNetwork" has incompatible type "Adam"' in done.stdout, done.stdout
    assert '"epochs" to "fit" of "NeuralNetwork"' in done.stdout, done.stdout   # fit's **unexpected is Never
    assert done.stdout.count("error:") == 2, done.stdout


def test_mypy_rejects_a_wrong_call_of_the_runner(tmp_path):
    script = tmp_path / "wrong.py"
    script.write_text("from ravop.runtime.runner import Runner\nRunner([], [0], [0], device=3)\n")
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary",
                           str(script)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1 and 'Argument "device" to "Runner" has incompatible type "int"' in done.stdout
