"""A clone stands alone: the README's install line gives the examples what they import, and the README and
the sources point only at files that are in the repository."""
import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
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
    for pattern in ("*.md", "**/*.py", "docs/*.md", "pyproject.toml"):
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


def test_paths_the_readme_and_the_docs_name_exist():
    """A file moved or removed leaves no doc pointing at it: the README and every page under docs/."""
    named = {(page.relative_to(ROOT).as_posix(), path) for page in [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]
             for path in PATH.findall(page.read_text())}
    assert ("README.md", "docs/architecture.md") in named and ("docs/layout.md", "tests/test_layering.py") in named
    assert [f"{page}: {path}" for page, path in sorted(named) if not (ROOT / path).exists()] == []
