"""The typed face of `import ravop as R`: ravop/__init__.pyi is what scripts/gen_stubs.py writes from the
registry today, and mypy accepts the public API modules and a script that uses them, and rejects a wrong call."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The public API: ravop's stub, ravdl.v2, the compiler's entry point, and a user's script.
PUBLIC = ["ravop/__init__.pyi", "ravdl/v2/__init__.py", "compiler/__init__.py", "tests/typing/uses_the_api.py"]
# The core interfaces, annotated throughout (every function, public or not): the Redis schema both sides share,
# the requester's session steps and the graph kinds they ask, federated statistics, the schema's names.
ANNOTATED = ["ravop/store", "ravop/session.py", "ravop/activation.py", "ravop/tracking.py", "ravop/fetching.py",
             "ravop/graph_kinds.py", "ravop/stored_values.py", "ravop/training_losses.py", "ravop/loss_names.py",
             "ravop/graph_states.py", "ravop/federated", "ravop/ops/federated_stats.py"]


def mypy(*paths, cache):
    """mypy with pyproject.toml's settings (torch and numpy read as untyped, which keeps it to seconds)."""
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-error-summary", *paths],
                          cwd=ROOT, capture_output=True, text=True)


def test_the_stub_is_in_sync_with_the_registry():
    done = subprocess.run([sys.executable, "scripts/gen_stubs.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_every_public_name_of_ravop_is_in_the_stub():
    import ravop as R
    stub = (ROOT / "ravop" / "__init__.pyi").read_text()
    public = {name for name in dir(R) if not name.startswith("_") and not isinstance(getattr(R, name), type(R))}
    missing = sorted(n for n in public if f"def {n}(" not in stub and f" as {n}\n" not in stub
                     and f"\n{n}: " not in stub and f"class {n}" not in stub)
    assert not missing, f"not in ravop/__init__.pyi: {missing}"


def test_mypy_accepts_the_public_api(tmp_path):
    done = mypy(*PUBLIC, cache=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_accepts_the_annotated_core_interfaces(tmp_path):
    done = mypy("--disallow-untyped-defs", "--disallow-incomplete-defs", *ANNOTATED, cache=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_rejects_a_wrong_call(tmp_path):
    script = tmp_path / "wrong.py"
    script.write_text("import ravop as R\nR.exp(R.t([1.0]), 3, 4)\nR.sum(R.t([1.0]), keepdims=True, axes=0)\n")
    done = mypy("ravop/__init__.pyi", str(script), cache=tmp_path / "cache")
    assert done.returncode == 1
    assert 'Too many arguments for "exp"' in done.stdout and 'Unexpected keyword argument "axes"' in done.stdout
