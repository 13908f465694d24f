"""The layering rules of docs/developers/layout.md, checked over every import statement in ravop, compiler, worker and
ravdl at any depth: at module level and inside functions and methods, since a deferred import is still a
dependency (it only hides a cycle until the function runs). Imports under `if TYPE_CHECKING:` never run and are
left out. As in grimp, `import a.b.c` is an edge to a.b.c, not to the packages a and a.b whose `__init__` runs
first; `test_importing_the_compiler_loads_no_redis` checks what an import loads at run time.

An AST walk rather than import-linter: networkx is a dependency already, the rules here (cycles reported module by
module, "imports X by name") are a few lines over a plain graph, and the walk needs no install."""
import ast
import pathlib
import subprocess
import sys

import networkx as nx

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("ravop", "compiler", "worker", "ravdl")


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _source_files():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _is_type_checking_block(node):
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree):
    """Every Import/ImportFrom in `tree`, at any depth, except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking_block(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph():
    """A DiGraph of module -> imported module: our modules by full dotted name, third-party ones by top-level
    name. An edge's `lines` attribute lists the importing lines, for messages."""
    files = {_module_name(path): path for path in _source_files()}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)

    def resolve(name):
        """The module `name` is, or the nearest enclosing one of ours; third-party names by their top level."""
        if name.split(".")[0] not in PACKAGES:
            return name.split(".")[0]
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name

    for module, path in files.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:   # relative: from the package holding this module, `level - 1` further up
                    anchor = module.split(".") if is_package else module.split(".")[:-1]
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from package import name` imports the submodule when `name` is one, else the package itself
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                           for alias in node.names]
            for target in {resolve(t) for t in targets}:
                if target and target != module:
                    graph.add_edge(module, target)
                    graph.edges[module, target].setdefault("lines", []).append(f"{path.relative_to(ROOT)}:"
                                                                                f"{node.lineno}")
    return graph


GRAPH = import_graph()


def ours(module):
    return module.split(".")[0] in PACKAGES


def under(module, prefix):
    return module == prefix or module.startswith(prefix + ".")


def import_cycles(graph):
    """Each import cycle as a list of modules: one per strongly connected component of our modules (a component
    of more than one module holds at least one cycle; its modules are listed, with one cycle through them)."""
    internal = graph.subgraph([m for m in graph if ours(m)])
    cycles = []
    for component in nx.strongly_connected_components(internal):
        if len(component) > 1:
            one = [edge[0] for edge in nx.find_cycle(internal.subgraph(component))]
            cycles.append((sorted(component), one + [one[0]]))
    return sorted(cycles)


def reached(graph, sources, is_forbidden):
    """{forbidden module: an import chain to it} over everything the modules in `sources` import, transitively."""
    found = {}
    for source in sources:
        paths = nx.single_source_shortest_path(graph, source)
        for target, path in paths.items():
            if is_forbidden(target) and target not in found:
                found[target] = path
    return found


def describe(chains):
    return "\n".join(f"  {target}: {' -> '.join(path)}" for target, path in sorted(chains.items()))


def modules_of(package):
    return [m for m in GRAPH if under(m, package)]


def test_there_are_no_import_cycles():
    cycles = import_cycles(GRAPH)
    assert not cycles, f"{len(cycles)} import cycle(s), imports inside functions counted:\n" + "\n".join(
        f"  {' -> '.join(cycle)}  (modules in the cycle: {', '.join(modules)})" for modules, cycle in cycles)


def test_the_compiler_never_reaches_redis_the_store_or_the_session():
    chains = reached(GRAPH, modules_of("compiler"), lambda m: m in ("redis", "hiredis") or any(
        under(m, f) for f in ("ravop.store", "ravop.client", "ravop.local", "ravop.tools")))
    assert not chains, "compiler reaches:\n" + describe(chains)


def test_the_worker_never_reaches_recording_strategies_the_client_the_compiler_or_ravdl():
    """A worker runs kernels over plans: it records nothing, so it needs no recorder (ravop.record), no strategy
    (ravop.parallel), no session (ravop.client), no compiler and no layers."""
    forbidden = ("ravop.record", "ravop.parallel", "ravop.client", "ravop.local", "ravop.tools", "compiler", "ravdl")
    chains = reached(GRAPH, modules_of("worker"), lambda m: any(under(m, f) for f in forbidden))
    assert not chains, "worker reaches:\n" + describe(chains)


# What `ravop-worker` loads of ravop (`python -c "import worker.serve.worker_cli"`): 102 modules before ravop was
# laid out by role, recording and all of ravop.parallel included. Raising it is a deliberate commit: 78 with
# ravop.store.quotas, the tokens' quotas a worker enforces (issue 44); 81 with the reproducible numerics mode's
# core/numerics_mode, ops/exact and ops/reproducible (issue 42); 82 with ravop.core.numerics_class (what a worker
# advertises of its numerics, issue 42); 83 with ravop.store.seals (a worker seals its outputs under a vote, issue 44);
# 84 with ravop.store.row_stream (a loop's training array streamed a window of chunks at a time, issue 46); 85 with
# ravop.store.votes (a worker reads the votes from each principal's own key, issue 44); 86 with ravop.core.heap (glibc's
# malloc_trim, shared with the requester, which trims what compiling a plan freed, issue 46).
WORKER_LOADS_AT_MOST = 86


def test_a_started_worker_loads_only_core_ops_wire_runtime_and_store():
    """What a fresh interpreter holds after importing the worker's entry module (the `ravop-worker` script's),
    counted: the rule above at run time, where an import by name (importlib) would show too."""
    done = subprocess.run([sys.executable, "-c", "import sys, worker.serve.worker_cli; print(*sorted(sys.modules))"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    ravop = [m for m in loaded if under(m, "ravop")]
    print(f"a worker loads {len(ravop)} of ravop's modules")
    allowed = ("ravop.core", "ravop.ops", "ravop.wire", "ravop.runtime", "ravop.store")
    assert [m for m in ravop if m != "ravop" and not any(under(m, a) for a in allowed)] == []
    assert [m for m in loaded if under(m, "compiler") or under(m, "ravdl")] == []
    assert len(ravop) <= WORKER_LOADS_AT_MOST, f"a worker loads {len(ravop)} of ravop's modules"


def test_the_runtime_never_reaches_recording_the_client_or_the_store():
    """ravop.runtime runs ops built from nodes: what it needs comes in as arguments (values, an exchange, a
    memory watcher), so the worker and in-process evaluation share it without a session or Redis."""
    chains = reached(GRAPH, modules_of("ravop.runtime"), lambda m: any(
        under(m, f) for f in ("ravop.record", "ravop.client", "ravop.store", "redis")))
    assert not chains, "ravop.runtime reaches:\n" + describe(chains)


def test_nothing_in_ravop_imports_the_worker():
    """ravop starts workers as programs (`python -m worker`, the fork server by its module name), never as code."""
    chains = reached(GRAPH, modules_of("ravop"), lambda m: under(m, "worker"))
    assert not chains, "ravop reaches:\n" + describe(chains)


def test_core_wire_and_store_stand_on_core_alone():
    """The vocabulary every side shares (ravop.core) imports nothing else of the project; the wire format reads
    only core, and the store only core and the wire format."""
    rules = {"ravop.core": ("ravop.core",), "ravop.wire": ("ravop.core", "ravop.wire"),
             "ravop.store": ("ravop.core", "ravop.wire", "ravop.store")}
    direct = {(m, t): GRAPH.edges[m, t]["lines"] for package, allowed in rules.items() for m in modules_of(package)
              for t in GRAPH.successors(m) if ours(t) and not any(under(t, a) for a in allowed)}
    assert not direct, f"imports outside their layer: {direct}"


def test_the_worker_imports_the_op_registry_by_name():
    """Its dispatch table is the registry ravop.ops fills; importing it by name, not through a module that happens
    to import it, keeps the table full whatever else changes."""
    importers = [m for m in modules_of("worker") if GRAPH.has_edge(m, "ravop.ops")]
    assert importers, "no module of worker imports ravop.ops"


def test_ravdl_imports_no_worker_compiler_or_redis_directly():
    direct = {(m, t): GRAPH.edges[m, t]["lines"] for m in modules_of("ravdl") for t in GRAPH.successors(m)
              if under(t, "worker") or under(t, "compiler") or t in ("redis", "hiredis")}
    assert not direct, f"ravdl imports: {direct}"


def test_importing_the_compiler_loads_no_redis():
    done = subprocess.run([sys.executable, "-c", "import compiler, sys; print('redis' in sys.modules)"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_walk_sees_imports_inside_functions_and_relative_ones():
    """The graph the rules read is right on what it is meant to see: a deferred import in a function and a
    relative import are edges; a TYPE_CHECKING-only one is not."""
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n"
                     "def f():\n    import b\n    class C:\n        def g(self):\n            from c import d\n")
    assert sorted(n.names[0].name if isinstance(n, ast.Import) else n.module for n in _imports(tree)) == \
        ["b", "c", "typing"]
    assert GRAPH.has_edge("ravop.ops", "ravop.ops.arithmetic")   # ravop/ops/__init__.py: `from . import ...`
