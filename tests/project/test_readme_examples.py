"""The tables of examples (docs/users/examples.md, linked from the README) are generated
(scripts/readme_examples.py): they match the results file the script wrote from the examples' own output, and
every example script has a row."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELPERS = {"example_data.py"}   # imported by the examples, not run


def readme_examples():
    if str(ROOT / "scripts") not in sys.path:   # the script imports its sibling scripts/generated_files.py
        sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("readme_examples", ROOT / "scripts" / "readme_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_examples_tables_are_the_rendered_results():
    done = subprocess.run([sys.executable, "scripts/readme_examples.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_every_example_script_has_a_row_with_results():
    script = readme_examples()
    scripts = {path.name for path in (ROOT / "examples").glob("*.py")} - HELPERS
    assert scripts == set(script.EXAMPLES) | set(script.ORIGINALS)
    results = json.loads(script.RESULTS.read_text())
    assert set(results) == scripts
    for name, (_, patterns, *_) in {**script.EXAMPLES, **script.ORIGINALS}.items():
        assert len(results[name]["figures"]) == len(patterns), name


def test_a_changed_result_changes_the_pages_row():
    script = readme_examples()
    results = json.loads(script.RESULTS.read_text())
    page = script.PAGE.read_text()
    assert script.PAGE == ROOT / "docs" / "users" / "examples.md"
    results["gpt_sort.py"] = {**results["gpt_sort.py"], "figures": ["0.123"], "seconds": 98.7, "load": [4.0, 6.5]}
    changed = script.render(page, results)
    row = next(line for line in changed.splitlines() if line.startswith("| `examples/gpt_sort.py`"))
    assert row.endswith("| held-out sequences sorted 0.123, 98.7 s (load 4-6.5) |")
    # the originals' table quotes the example it compares with
    assert "| 0.123 (`gpt_sort.py`) |" in changed


def test_the_readme_links_the_examples_page():
    assert "`docs/users/examples.md`" in (ROOT / "README.md").read_text()
