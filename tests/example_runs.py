"""Runs an example script as a user runs it (a subprocess, the embedded default engine) in a private working
directory and temp dir, and asserts it leaves no file behind: none new in the checkout (examples/ included, ignored
files too), in its working directory or in its temp dir. Every test that runs an example goes through
`run_example`; tests/project/test_examples.py checks that each script under examples/ is run by one."""
import getpass
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def untracked() -> set[str]:
    """The files git sees as new and not ignored: what an example must not leave in the checkout."""
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr   # the tests run in a git checkout
    return {line[3:] for line in done.stdout.splitlines() if line.startswith("??")}


def examples_folder() -> set[str]:
    """Every file under examples/, ignored ones (examples/output/) included; Python's bytecode cache aside."""
    return {str(path.relative_to(ROOT)) for path in (ROOT / "examples").rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


def listing(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def left_in_temp(folder: Path) -> list[str]:
    """`listing(folder)` but torch's own cache folder while it is empty: any torch program makes
    `$TMPDIR/torchinductor_<user>` (at an optimizer's first step, at an ONNX export), a cache shared by all of them."""
    cache = folder / f"torchinductor_{getpass.getuser()}"
    return [name for name in listing(folder) if not (folder / name == cache and not any(cache.iterdir()))]


def run_example(script: str, epochs: int | None = None, args: tuple[str, ...] = (), env: dict | None = None,
                timeout: int = 300) -> str:
    """Its stdout; `epochs` as $RAVDL_EPOCHS, `args` after the script, `env` added to the environment. Files it is
    asked to write go to a folder it is given (an argument or $RAVOP_EXAMPLES_OUTPUT) outside the checkout."""
    with tempfile.TemporaryDirectory(prefix="example-run-") as private:
        cwd, tmp = Path(private) / "cwd", Path(private) / "tmp"
        cwd.mkdir()
        tmp.mkdir()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), **(env or {})}
        if epochs is not None:
            env["RAVDL_EPOCHS"] = str(epochs)
        env.pop("RAVOP_REDIS_URL", None)   # the embedded default, as a first-time user runs it
        before, before_examples = untracked(), examples_folder()
        done = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert not untracked() - before, f"{script} left files in the checkout: {sorted(untracked() - before)}"
        assert examples_folder() == before_examples, \
            f"{script} left files in examples/: {sorted(examples_folder() - before_examples)}"
        assert not listing(cwd), f"{script} left files in its working directory: {listing(cwd)}"
        assert not left_in_temp(tmp), f"{script} left files in its temp dir ($TMPDIR): {left_in_temp(tmp)}"
    return done.stdout
