"""No op name as a string outside ravop/ops/: code asks an op's declared flags and kinds (ravop/core/registry.py),
never its name. Every string literal in ravop (but ravop/ops/), compiler, worker and ravdl that equals a registered
op name (or alias) fails this test, docstrings aside, and so do attribute names (`__slots__`) and protobuf field
names (`HasField`), which can never be op names, unless `ALLOWED` lists it with its reason."""
import ast
from pathlib import Path

import ravop.ops  # noqa: F401  (fills the registry)
from ravop.core import registry

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ravop", "compiler", "worker", "ravdl")

# path -> (the op names it may spell, why). Kept as small as it can be; each entry is either the user's own
# vocabulary or a word that only spells the same as an op.
ALLOWED = {
    # the hand-written `R.<op>` functions record their op by name: they live in record/, not beside their kernels,
    # so that a worker (which loads ravop/ops) never loads the recorder
    "ravop/record/frontends.py": ({"cast", "where", "foreach", "index", "set_value", "median"},
                                  "the hand-written R.<op> functions and the ops they record"),
    # the calibration's unit: `op_s` of the cost model is defined as the time of one add op run by the runner
    "worker/serve/calibrate.py": ({"add"}, "op_s is the time of one `add` op (compiler/cost.py's unit)"),
    # user-facing arguments: RavDL's Activation layer takes an op's name, as Keras takes an activation's
    "ravdl/v2/layers/core.py": ({"relu"}, "Activation(name='relu'), the user's vocabulary"),
    # words that spell an op's name and mean something else
    "ravop/core/registry.py": ({"index", "loop"}, "the params of the PROJECTION and LOOP ops (`PICKS`, `LOOP_INDEX`), "
                                                  "spelled once; plans on the wire carry them"),
    "ravop/federated/partials.py": ({"mean", "min", "max"}, "names of a column's federated statistics"),
    "ravop/federated/privacy.py": ({"mean", "min", "max"}, "names of a column's federated statistics"),
    "ravop/federated/release.py": ({"mean", "min", "max"}, "names of a column's federated statistics"),
    "ravop/federated/column_rules.py": ({"min", "max"}, "a column rule's bounds"),
    "ravop/client/federated_graphs.py": ({"min", "max"}, "names of federated statistics"),
    "worker/provider/data_provider.py": ({"mean", "variance"}, "names of federated statistics"),
    "ravdl/v2/callbacks.py": ({"min", "max"}, "EarlyStopping(mode='min'), Keras' vocabulary"),
    "ravdl/v2/layers/convolution.py": ({"zeros"}, "Conv2D(padding_mode='zeros'), torch's vocabulary"),
    "ravdl/v2/lr_schedules.py": ({"linear"}, "a learning-rate schedule's kind, torch's LinearLR"),
    "ravop/record/index_spec.py": ({"index"}, "a regular expression's group"),
    "ravop/tools/cluster_cli.py": ({"shape"}, "a key of the command line's JSON output"),
    "ravop/local/forked_workers.py": ({"log"}, "a key of the fork server's command"),
    "worker/serve/forkserver.py": ({"log"}, "a key of the fork server's command"),
    "worker/verify/spot.py": ({"split"}, "a spot check's verdict"),
    "ravop/store/votes.py": ({"split"}, "a spot check's state, derived from its votes"),
    "worker/verify/spot_loop.py": ({"split"}, "a spot check's verdict"),
    "compiler/passes/loops.py": ({"unique"}, "a tag of a grouping key"),
}


def _never_op_names(tree):
    """ids of the string constants that cannot be op names: docstrings, `__slots__` entries, `HasField` args."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skipped.add(id(first.value))
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                  for t in node.targets):
            skipped.update(id(c) for c in ast.walk(node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "HasField":
            skipped.update(id(c) for a in node.args for c in ast.walk(a))
    return skipped


def op_name_strings():
    """(path, line, string) of every string literal outside ravop/ops/ that equals an op's name."""
    names = set(registry.REGISTRY)
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("ravop/ops/"):
                continue
            tree = ast.parse(path.read_text(), rel)
            skipped = _never_op_names(tree)
            found += [(rel, node.lineno, node.value) for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and type(node.value) is str and node.value in names
                      and id(node) not in skipped]
    return found


def test_no_op_name_is_spelled_outside_the_ops():
    found = [(path, line, name) for path, line, name in op_name_strings()
             if name not in ALLOWED.get(path, ((), ""))[0]]
    assert not found, "op names as strings (ask the OpDef's declared flags and kinds instead): " + ", ".join(
        f"{path}:{line} {name!r}" for path, line, name in found)


def test_the_allow_list_holds_nothing_stale():
    """Each allowed name is still spelled where it is allowed, and is still an op's: a fixed one leaves the list."""
    used = {(path, name) for path, _, name in op_name_strings()}
    stale = [(path, name) for path, (names, _) in ALLOWED.items() for name in names if (path, name) not in used]
    assert not stale, f"allowed but no longer found: {stale}"


def test_the_scan_sees_what_it_looks_for():
    """The walker finds a comparison with an op's name and a dict keyed by one, and skips a docstring."""
    tree = ast.parse('"""adam_step"""\nif node.op == "dropout": pass\nTABLE = {"batch_norm": 1}\n')
    skipped = _never_op_names(tree)
    spelled = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) is str
               and id(n) not in skipped]
    assert spelled == ["dropout", "batch_norm"]
