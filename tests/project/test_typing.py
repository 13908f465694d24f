"""The typed face of `import ravop as R`: ravop/__init__.pyi is what scripts/gen_stubs.py writes from the
registry today, and mypy accepts the public API modules and a script that uses them, and rejects a wrong call."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The public API: ravop's stub, ravdl.v2, the compiler's entry point, and a user's script.
PUBLIC = ["ravop/__init__.pyi", "ravdl/v2/__init__.py", "compiler/__init__.py", "tests/typing/uses_the_api.py"]
# The core interfaces, annotated throughout (every function, public or not): the Redis schema both sides share,
# the requester's session steps and the graph kinds they ask, federated statistics, the schema's names.
ANNOTATED = ["ravop/store", "ravop/client/session.py", "ravop/client/activation.py", "ravop/client/tracking.py",
             "ravop/client/fetching.py", "ravop/client/graph_kinds.py", "ravop/client/stored_values.py",
             "ravop/client/training_losses.py", "ravop/core/loss_names.py", "ravop/core/graph_states.py",
             "ravop/federated", "ravop/ops/federated_stats.py"]


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


def test_a_wheel_ships_py_typed_and_the_stub_and_mypy_reads_them_installed(tmp_path):
    """Installed (not this checkout on mypy's path), ravop is typed only with its PEP 561 marker: without it mypy
    skips the package ("missing library stubs or py.typed marker") and every `R.<op>` is Any."""
    import zipfile
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "wheel"), str(ROOT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert {"ravop/py.typed", "ravop/__init__.pyi", "ravdl/py.typed", "compiler/py.typed"} <= names
        archive.extractall(tmp_path / "site")
    user = tmp_path / "user"
    user.mkdir()
    (user / "script.py").write_text("import ravop as R\nfrom ravdl.v2 import NeuralNetwork\n"
                                    "from compiler import compile_graph\nx = R.t([1.0, 2.0])\n"
                                    "reveal_type(x.reshape)\nR.exp(x, 3, 4)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path / "site")   # mypy searches PYTHONPATH as installed packages (PEP 561)
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--no-error-summary", "script.py"],
                          cwd=user, env=env, capture_output=True, text=True)
    assert "py.typed" not in done.stdout and "import-untyped" not in done.stdout, done.stdout
    assert 'Revealed type is "def (shape: Any) -> ravop.Op"' in done.stdout, done.stdout
    assert 'Too many arguments for "exp"' in done.stdout, done.stdout


def test_inspect_signature_shows_an_ops_parameters():
    import inspect

    import ravop as R
    assert list(inspect.signature(R.matmul).parameters) == ["x", "y"]
    sum_params = inspect.signature(R.sum).parameters
    assert list(sum_params) == ["x", "axis", "keepdims"] and sum_params["keepdims"].default is False
    assert list(inspect.signature(R.concat).parameters) == ["xs", "axis"]
    R.Graph(name="signatures")
    x = R.t([[1.0, 2.0]])
    assert list(inspect.signature(x.reshape).parameters) == ["shape"]   # bound: the tensor is `self`
    assert list(inspect.signature(x.sum).parameters) == ["axis", "keepdims"]
    assert list(inspect.signature(x.concat).parameters) == ["more", "params"]
    assert x.concat(x, axis=0).shape == (2, 2)   # the method still records as before
    bound = inspect.signature(R.sum).bind(x, 1, keepdims=True)
    assert R.sum(*bound.args, **bound.kwargs).shape == (1, 1)


def test_every_generated_function_signature_names_its_inputs_and_params():
    """The signature is made from the registry entry the call binds to, for every op (not only those above)."""
    import inspect

    import ravop as R
    from ravop.core import registry
    from ravop.record import api
    checked = 0
    for name, opdef in registry.REGISTRY.items():
        if opdef.internal or opdef.name in api.FRONTENDS:
            continue
        parameters = list(inspect.signature(getattr(R, name)).parameters)
        want = list(opdef.inputs[:1] if opdef.variadic else opdef.inputs) + list(opdef.params)
        assert parameters == want, name
        checked += 1
    assert checked > 100


def _jedi_script(source, tmp_path):
    import jedi
    project = jedi.Project(str(tmp_path), sys_path=[str(ROOT), *sys.path])
    return jedi.Script(source, path=str(tmp_path / "script.py"), project=project)


def test_jedi_completes_the_op_methods_of_a_constant_with_their_signatures(tmp_path):
    source = "import ravop as R\nx = R.t([1.0, 2.0])\nx.resh"
    completions = _jedi_script(source, tmp_path).complete(3, len("x.resh"))
    assert [c.name for c in completions] == ["reshape"]
    (signature,) = completions[0].get_signatures()
    assert signature.to_string() == "reshape(shape: Any) -> Op"
    call = "import ravop as R\ny = R.matmul(R.t([1.0]), R.t([2.0]))\ny.sum("
    (signature,) = _jedi_script(call, tmp_path).get_signatures(3, len("y.sum("))
    assert signature.to_string() == "sum(axis: Any=..., keepdims: bool=...) -> Op"
