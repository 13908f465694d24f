"""A stated time budget per test file (tests/durations.toml), registered by tests/conftest.py: each file's time is
the sum of its tests' setup, call and teardown (what the file costs one pytest process, whatever `-n`/`--dist`),
and at the end of the run the files over their budget are listed as a warning, never a failure (the machines are
shared and noisy: timing limits belong in benchmarks). The run fails only when a file ran with no budget stated, so
that a new test file is given one (docs/developers/testing.md, "A budget per test file")."""
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

BUDGETS_FILE = Path(__file__).with_name("durations.toml")


def read_budgets(path: Path = BUDGETS_FILE) -> dict[str, float]:
    """File name (as in tests/) -> seconds; a budget that is not a positive number is an error naming it."""
    table = tomllib.loads(path.read_text()).get("budgets")
    if not isinstance(table, dict):
        raise ValueError(f"{path}: no [budgets] table of test file -> seconds")
    for name, seconds in table.items():
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise ValueError(f"{path}: the budget of {name} must be a positive number of seconds, not {seconds!r}")
    return {name: float(seconds) for name, seconds in table.items()}


def over_budget(seconds: dict[str, float], budgets: dict[str, float]) -> list[tuple[str, float, float]]:
    """(file, measured seconds, budget) of each file with a budget that took longer, slowest over budget first."""
    over = [(name, spent, budgets[name]) for name, spent in seconds.items() if name in budgets
            and spent > budgets[name]]
    return sorted(over, key=lambda row: row[1] / row[2], reverse=True)


def unbudgeted(files: set[str], budgets: dict[str, float]) -> list[str]:
    return sorted(files - set(budgets))


class FileBudgets:
    """Sums the phases' durations per file from the test reports: in an xdist run the workers' reports reach the
    controller, which alone prints the summary."""

    def __init__(self, budgets: dict[str, float], show_all: bool) -> None:
        self.budgets, self.show_all = budgets, show_all
        self.seconds: dict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[Path(report.nodeid.split("::")[0]).name] += report.duration

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if unbudgeted(set(self.seconds), self.budgets) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.show_all:   # --file-times: what a budget is set from
            terminalreporter.section("seconds per test file (setup + call + teardown)")
            for name, spent in sorted(self.seconds.items(), key=lambda item: item[1], reverse=True):
                budget = self.budgets.get(name)
                terminalreporter.line(f"{name}: {spent:.1f} s, budget {budget:.0f} s" if budget else
                                      f"{name}: {spent:.1f} s, no budget")
        over = over_budget(self.seconds, self.budgets)
        if over:
            terminalreporter.section("test files over their budget (tests/durations.toml; a warning, not a failure)")
            for name, spent, budget in over:
                terminalreporter.line(f"{name}: {spent:.1f} s, budget {budget:.0f} s ({spent / budget:.1f}x)")
        missing = unbudgeted(set(self.seconds), self.budgets)
        if missing:
            terminalreporter.section("test files with no budget (FAILS the run)", red=True)
            for name in missing:
                terminalreporter.line(f"{name}: {self.seconds[name]:.1f} s; add it to tests/durations.toml "
                                      "(docs/developers/testing.md)", red=True)


def install(config: pytest.Config) -> None:
    """Register the plugin in the process that reports (not in an xdist worker, whose reports go to it)."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(FileBudgets(read_budgets(), config.getoption("file_times")), "file_budgets")


def add_option(parser: pytest.Parser) -> None:
    parser.addoption("--file-times", action="store_true", dest="file_times",
                     help="print every test file's seconds and budget (tests/durations.toml) at the end")
