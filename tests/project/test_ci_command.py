"""CI runs the README's test command, and that command runs the suite in parallel (pytest-xdist)."""
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pytest_arguments(text):
    """The arguments of the last `python -m pytest` command in `text`."""
    commands = re.findall(r"python -m pytest[^\n&|;]*", text)
    assert commands, "no pytest command"
    return shlex.split(commands[-1])[3:]


def test_ci_runs_the_readmes_parallel_test_command():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("Run the tests"):]
    documented = pytest_arguments(section[:section.index("```", section.index("```bash") + 3)])
    assert pytest_arguments((ROOT / ".ci" / "run").read_text()) == documented
    assert "-n" in documented and "--dist" in documented, documented
