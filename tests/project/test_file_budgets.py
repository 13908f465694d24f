"""Issue 45: every test file has a stated budget in tests/durations.toml; the plugin (tests/file_budgets.py) sums a
file's setup, call and teardown, lists the files over budget as a warning, and fails a run only for a file with
no budget."""
import tomllib
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

import file_budgets

TESTS = Path(__file__).resolve().parents[1]   # tests/, whose folders hold the test files
ROOT = TESTS.parent


def report(nodeid: str, when: str, duration: float) -> pytest.TestReport:
    return pytest.TestReport(nodeid, (nodeid, 0, ""), {}, "passed", None, when, duration=duration)


def test_every_test_file_has_a_budget_and_every_budget_a_file():
    budgets = file_budgets.read_budgets()
    files = {path.name for path in TESTS.rglob("test_*.py")}
    assert file_budgets.unbudgeted(files, budgets) == [], "give each new test file a budget in tests/durations.toml"
    assert sorted(set(budgets) - files) == [], "a budget names a test file that no longer exists"


def test_test_files_have_unique_basenames_and_their_folders_are_on_the_path():
    """Budgets are keyed by basename, and a test module imports another's fixtures by its basename from any folder
    (docs/developers/testing.md, "Where a test goes")."""
    paths = list(TESTS.rglob("test_*.py"))
    assert len(paths) > 100
    assert [name for name, count in Counter(path.name for path in paths).items() if count > 1] == []
    pythonpath = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["pythonpath"]
    folders = {path.parent.relative_to(ROOT).as_posix() for path in paths}
    assert sorted(folders - set(pythonpath)) == [], "add the new folder to pyproject's pythonpath"


def test_a_file_sums_its_phases_and_over_budget_is_listed_slowest_first():
    plugin = file_budgets.FileBudgets({"test_a.py": 10, "test_b.py": 4, "test_c.py": 100}, show_all=False)
    for nodeid, when, seconds in [("tests/ops/test_a.py::t1", "setup", 6.0), ("tests/ops/test_a.py::t1", "call", 3.0),
                                  ("tests/ops/test_a.py::t2", "teardown", 2.0),
                                  ("tests/worker/loops/test_b.py::t", "call", 12.0), ("tests/test_c.py::t", "call", 1.0)]:
        plugin.pytest_runtest_logreport(report(nodeid, when, seconds))
    assert plugin.seconds == {"test_a.py": 11.0, "test_b.py": 12.0, "test_c.py": 1.0}
    assert file_budgets.over_budget(plugin.seconds, plugin.budgets) == [("test_b.py", 12.0, 4.0),
                                                                         ("test_a.py", 11.0, 10.0)]


def test_over_budget_passes_but_a_file_without_budget_fails_the_run():
    plugin = file_budgets.FileBudgets({"test_a.py": 1}, show_all=False)
    plugin.pytest_runtest_logreport(report("tests/test_a.py::t", "call", 50.0))
    session = SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    plugin.pytest_sessionfinish(session)
    assert session.exitstatus == pytest.ExitCode.OK   # slow is a warning: the machines are shared
    plugin.pytest_runtest_logreport(report("tests/test_new.py::t", "call", 0.1))
    plugin.pytest_sessionfinish(session)
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED


@pytest.mark.parametrize("text, problem", [("[other]\n", "no \\[budgets\\] table"),
                                           ('[budgets]\n"test_a.py" = 0\n', "test_a.py must be a positive number"),
                                           ('[budgets]\n"test_a.py" = "10"\n', "test_a.py must be a positive")])
def test_a_malformed_budget_is_refused_by_name(tmp_path, text, problem):
    path = tmp_path / "durations.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem):
        file_budgets.read_budgets(path)
