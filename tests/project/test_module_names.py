"""Each module's name says what it holds: no two modules of ravop, compiler, worker and ravdl share a basename
(`rules.py` of shapes and `rules.py` of federated columns read the same in a traceback, an import and a search).
Package files (`__init__.py`) and `__main__.py` (what `python -m` runs) are named by Python, not by us."""
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("ravop", "compiler", "worker", "ravdl")
NAMED_BY_PYTHON = {"__init__.py", "__main__.py"}

def modules_by_basename():
    found = collections.defaultdict(set)
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name not in NAMED_BY_PYTHON:
                found[path.name].add(path.relative_to(ROOT).as_posix())
    return found


def test_no_two_modules_share_a_basename():
    shared = {name: sorted(paths) for name, paths in modules_by_basename().items()
              if len(paths) > 1}
    assert not shared, f"modules sharing a name (rename one so that each says what it holds): {shared}"

