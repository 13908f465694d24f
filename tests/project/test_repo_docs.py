"""A clone stands alone: the README's install line gives the examples what they import, and the README, the
docs and the sources' docstrings and comments point only at files and modules that are in the repository."""
import ast
import io
import re
import tokenize
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
# The project's packages, and the example scripts themselves (one may import another's helpers).
OWN_MODULES = {"ravop", "ravdl", "compiler", "worker"} | {p.stem for p in (ROOT / "examples").glob("*.py")}


def third_party_imports(path):
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - OWN_MODULES


def test_the_examples_extra_and_the_base_install_cover_every_example_import():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = {canonicalize_name(Requirement(r).name)
                 for r in project["dependencies"] + project["optional-dependencies"]["examples"]}
    providers = packages_distributions()
    imports = set().union(*(third_party_imports(p) for p in (ROOT / "examples").glob("*.py")))
    assert "sklearn" in imports  # the check below is not vacuous
    for module in sorted(imports):
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        assert dists & installed, f"examples import {module!r} (from {sorted(dists)}), which neither the " \
                                  "dependencies nor the examples extra install"


def test_readme_install_line_installs_the_examples_extra():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r'pip install -e "\.\[examples\]" && python examples/', readme)


def repository_texts():
    for pattern in ("*.md", "**/*.py", "docs/**/*.md", "pyproject.toml"):
        for path in ROOT.glob(pattern):
            if ".git" not in path.parts and "samples" not in path.parts and path.name != Path(__file__).name:
                yield path


def test_no_file_points_outside_the_repository():
    outside = re.compile(r"\.\./shared|REFERENCE\.md|DESIGN\.md")
    offenders = [f"{path.relative_to(ROOT)}: {match.group(0)}" for path in repository_texts()
                 for match in outside.finditer(path.read_text(errors="replace"))]
    assert not offenders


# A path of this repository as the docs write it: in backquotes, bare, or inside a table or a code block.
PATH = re.compile(r"(?<![\w/.])((?:docs|examples|benchmarks|ravop|ravdl|compiler|worker|tests|scripts)/[\w./-]*\w"
                  r"\.(?:md|py|proto|json|png))")
# A markdown link or image to a file beside the page: [text](target) without a scheme.
LINK = re.compile(r"\]\((?![a-z]+:|#)([^)\s#]+)")
PAGES = [ROOT / "README.md", *sorted(ROOT.glob("docs/**/*.md"))]


def test_paths_the_readme_and_the_docs_name_exist():
    """A file moved or removed leaves no doc pointing at it: the README and every page under docs/, at any depth."""
    named = {(page.relative_to(ROOT).as_posix(), path) for page in PAGES for path in PATH.findall(page.read_text())}
    assert ("README.md", "docs/users/determinism.md") in named
    assert ("docs/developers/layout.md", "tests/project/test_layering.py") in named
    assert [f"{page}: {path}" for page, path in sorted(named) if not (ROOT / path).exists()] == []


def test_links_of_the_readme_and_the_docs_resolve_from_their_page():
    linked = [(page, target) for page in PAGES for target in LINK.findall(page.read_text())]
    assert (ROOT / "docs" / "operators" / "operations.md", "../metrics.png") in linked
    missing = [f"{page.relative_to(ROOT)}: {target}" for page, target in linked if not (page.parent / target).exists()]
    assert missing == []


def test_the_readme_is_an_index():
    """What it is, the two commands, a first model, first two machines, links: the manual lives in docs/."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    sections = re.findall(r"^## (.+)$", readme, re.M)
    for section in ("Quick start (fresh machine)", "A first model", "First two machines", "Determinism",
                    "Documentation"):
        assert section in sections, sections
    # every page under docs/ is reachable from the README
    pages = [page.relative_to(ROOT).as_posix() for page in PAGES[1:]]
    assert [page for page in pages if page not in readme] == []


# In the docstrings and comments of the packages (and of the tests, benchmarks, scripts, examples and the
# walkthrough): a file path (from the repository's root, from the module's top folder, or from its own folder or
# one above) and a dotted module name (`ravop.runtime.evaluate`, possibly followed by a name it defines) must name
# what exists; a re-layout leaves no old name behind.
PACKAGES = ("ravop", "compiler", "worker", "ravdl")
CODE_FOLDERS = (*PACKAGES, "tests", "benchmarks", "scripts", "examples", "docs")
PROSE_PATH = re.compile(r"(?<![\w/.$-])((?:[\w-]+/)+[\w-]+\.(?:py|md|proto|json|png))(?![\w/])")
MODULE = re.compile(r"(?<![\w./\"'])((?:ravop|compiler|worker|ravdl)(?:\.[A-Za-z_]\w*)+)")


def prose(path):
    """(line, text) of each comment and docstring of a module."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                yield first.lineno, first.value.value


def path_exists(named, module):
    return any((base / named).exists() for base in (ROOT, ROOT / module.relative_to(ROOT).parts[0], *module.parents))


def module_exists(dotted):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        folder = ROOT.joinpath(*parts[:i])
        source = folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")
        if source.exists():
            if i == len(parts):
                return True
            text = source.read_text()
            if parts[:i] == ["ravop"]:   # `R`'s names load from the requester's module
                text += (ROOT / "ravop" / "client" / "requester.py").read_text()
            return re.search(rf"\b{re.escape(parts[i])}\b", text) is not None
    return False


def test_paths_and_modules_the_code_s_docstrings_and_comments_name_exist():
    stale = []
    modules = [path for folder in CODE_FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
               if "samples" not in path.relative_to(ROOT).parts]
    assert len(modules) > 300
    for module in modules:
        for line, text in prose(module):
            where = f"{module.relative_to(ROOT)}:{line}"
            stale += [f"{where}: {path}" for path in PROSE_PATH.findall(text) if not path_exists(path, module)]
            stale += [f"{where}: {name}" for name in MODULE.findall(text) if not module_exists(name)]
    assert stale == []


def test_the_code_check_sees_old_names():
    assert not module_exists("ravop.interpreter") and not module_exists("ravop.runner.Runner")
    assert module_exists("ravop.runtime.runner.Runner") and module_exists("ravop.runtime.evaluate")
    assert not path_exists("worker/loop_subgraph.py", ROOT / "ravop" / "runtime" / "runner.py")
    assert path_exists("runtime/runner.py", ROOT / "ravop" / "ops" / "nn.py")
